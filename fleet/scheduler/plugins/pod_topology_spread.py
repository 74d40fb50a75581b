"""PodTopologySpread: spread matching pods evenly over topology domains (zones, nodes, ...).

A constraint says: among the pods its `labelSelector` matches (in the pod's
namespace), the number in any domain of `topologyKey` may exceed the least
populated domain by at most `maxSkew`.  Semantics are kube-scheduler's:

- `whenUnsatisfiable: DoNotSchedule` constraints filter: placing the pod on a
  node must keep `matching pods in the node's domain + (1 if the pod matches
  its own selector) - global minimum <= maxSkew`.  A node without the
  topology label is refused "(missing required label)", unresolvably;
- `ScheduleAnyway` constraints score: fewer matching pods in the node's
  domain is better, each constraint weighted by log(number of domains + 2)
  so small topologies are not drowned by large ones;
- domains are the label values of *eligible* nodes: nodes carrying every
  constraint's topology key and, per `nodeAffinityPolicy` (default Honor),
  matching the pod's nodeSelector / required node affinity and, per
  `nodeTaintsPolicy` (default Ignore), tolerated by the pod.  Pods on other
  nodes do not count;
- `minDomains`: while fewer eligible domains exist, the global minimum is
  taken as 0 (so new domains get filled first);
- `matchLabelKeys`: the pod's values of those labels are ANDed into the
  selector (e.g. `pod-template-hash`, to spread each rollout revision);
- terminating pods are not counted.

Cluster default constraints: a pod without constraints of its own gets the
profile's defaults (`defaultingType: System` — kube-scheduler's built-ins:
hostname maxSkew 3 and zone maxSkew 5, both ScheduleAnyway — or `List` with
`defaultConstraints`).  Simplification: kube-scheduler derives the default
selector from the Services, ReplicaSets, ReplicationControllers and
StatefulSets selecting the pod; the snapshot has none of those, so we apply
defaults only to pods *controlled* by a ReplicaSet, ReplicationController or
StatefulSet, with the pod's own labels as the selector, minus the labels
controllers stamp per pod or per revision (`statefulset.kubernetes.io/pod-name`,
`controller-revision-hash`, ...) — for a Deployment's pods that equals the
ReplicaSet selector (which includes `pod-template-hash`).  Services are not
considered.

Performance: the counts come from `Snapshot.match_count`, maintained as pods
come and go, so a cycle costs O(domains) (a dict lookup per node in filter),
not O(pods).  Only a pod that honours node affinity or taints, or a cluster
where some node lacks a topology key, walks the nodes once per cycle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.api.nodeaffinity import RequiredNodeAffinity, required_node_affinity
from fleet.api.owners import controller_of
from fleet.api.selectors import EQUALS, LabelSelector, Requirement
from fleet.scheduler.affinity import merge_label_keys, parse_selector
from fleet.scheduler.framework import (
    MAX_NODE_SCORE,
    Code,
    CycleState,
    PodCountingExtensions,
    Status,
)
from fleet.scheduler.plugins._cycle import DEFERRED, cycle_snapshot, resolve_deferred
from fleet.scheduler.plugins._scoring import go_round
from fleet.scheduler.plugins.taint_toleration import pod_tolerations, untolerated_hard_taint
from fleet.scheduler.podinfo import pod_labels
from fleet.scheduler.snapshot import HOSTNAME_LABEL, ZONE_LABEL, MatchCount, NodeInfo, Snapshot

ERR_REASON_CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
ERR_REASON_NODE_LABEL_NOT_MATCH = ERR_REASON_CONSTRAINTS_NOT_MATCH + " (missing required label)"

DO_NOT_SCHEDULE = "DoNotSchedule"
SCHEDULE_ANYWAY = "ScheduleAnyway"
HONOR, IGNORE = "Honor", "Ignore"
DEFAULTING_SYSTEM, DEFAULTING_LIST = "System", "List"

SYSTEM_DEFAULT_CONSTRAINTS: tuple[dict[str, Any], ...] = (
    {"maxSkew": 3, "topologyKey": HOSTNAME_LABEL, "whenUnsatisfiable": SCHEDULE_ANYWAY},
    {"maxSkew": 5, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": SCHEDULE_ANYWAY},
)
DEFAULT_SELECTOR_OWNERS = ("ReplicaSet", "ReplicationController", "StatefulSet")
# Labels controllers add per pod or per revision; a selector built from the
# pod's labels must leave them out or it would match only the pod itself.
PER_POD_LABELS = frozenset({
    "statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index", "controller-revision-hash",
    "batch.kubernetes.io/job-completion-index",
})

# The "global minimum" when no domain is eligible: every skew passes, as upstream.
_NO_DOMAINS = 1 << 31

# Statuses are immutable: built once, not per node.
_SUCCESS = Status.success()
_NOT_MATCH = Status.unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH)
_MISSING_LABEL = Status.unschedulable(ERR_REASON_NODE_LABEL_NOT_MATCH, unresolvable=True)


@dataclass(frozen=True)
class SpreadConstraint:
    max_skew: int
    topology_key: str
    selector: LabelSelector
    min_domains: int = 1
    honor_node_affinity: bool = True
    honor_taints: bool = False


def _policy(raw: Any, default: str, name: str) -> bool:
    value = default if raw is None else raw
    if value not in (HONOR, IGNORE):
        raise ValueError(f"{name} must be Honor or Ignore, not {value!r}")
    return value == HONOR


def parse_constraint(raw: Any, labels: Mapping[str, str], selector: LabelSelector | None = None) -> SpreadConstraint:
    """One TopologySpreadConstraint; `selector` overrides its labelSelector (cluster defaults)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"topology spread constraint must be an object, not {raw!r}")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ValueError("topologyKey is required")
    max_skew = int(raw.get("maxSkew") or 0)
    if max_skew < 1:
        raise ValueError(f"maxSkew must be greater than zero, not {max_skew}")
    min_domains = int(raw.get("minDomains") or 1)
    if selector is None:
        selector = merge_label_keys(parse_selector(raw.get("labelSelector")), labels,
                                    raw.get("matchLabelKeys") or ())
    return SpreadConstraint(max_skew, key, selector, min_domains,
                            _policy(raw.get("nodeAffinityPolicy"), HONOR, "nodeAffinityPolicy"),
                            _policy(raw.get("nodeTaintsPolicy"), IGNORE, "nodeTaintsPolicy"))


def default_selector(pod: dict[str, Any]) -> LabelSelector | None:
    """The selector cluster defaults spread a controlled pod by (see the module docstring)."""
    md = pod.get("metadata") or {}
    controller = controller_of(pod)
    controlled = controller is not None and controller.get("kind") in DEFAULT_SELECTOR_OWNERS
    labels = {k: v for k, v in (md.get("labels") or {}).items() if k not in PER_POD_LABELS}
    if not controlled or not labels:
        return None
    return LabelSelector.of(Requirement(str(k), EQUALS, (str(v),)) for k, v in labels.items())


def _counts_nothing(selector: LabelSelector) -> bool:
    # Upstream counts no pod for an empty selector (and a nil one selects nothing).
    return selector.nothing or selector.empty()


class _FilterState:
    """Per DoNotSchedule constraint: matching pods per domain, the domains, and the global minimum."""

    __slots__ = ("constraints", "counts", "domains", "min_match", "self_match", "owned", "checks")

    def __init__(self, constraints: list[SpreadConstraint], counts: list[dict[str, int]],
                 domains: list[Mapping[str, Any]], self_match: list[int]) -> None:
        self.constraints = constraints
        self.counts = counts
        self.domains = domains
        self.self_match = self_match
        self.owned = [False] * len(constraints)  # counts[i] is ours to mutate (copy-on-write)
        self.min_match = [self._min(i) for i in range(len(constraints))]
        self.checks: list[tuple[str, int, Mapping[str, int], int, int]] = []
        self._refresh()

    def _refresh(self) -> None:
        # Flattened for the per-node loop in `filter`.
        self.checks = [(c.topology_key, c.max_skew, self.counts[i], self.self_match[i], self.min_match[i])
                       for i, c in enumerate(self.constraints)]

    def _min(self, i: int) -> int:
        # counts' keys are a subset of the domains and never negative; a
        # domain missing from counts has no matching pod, so the minimum is 0.
        domains, counts = self.domains[i], self.counts[i]
        if not domains:
            return _NO_DOMAINS
        if len(domains) < self.constraints[i].min_domains or len(counts) < len(domains):
            return 0
        return min(counts.values())

    def bump(self, i: int, value: str, delta: int) -> None:
        if not self.owned[i]:
            self.counts[i] = dict(self.counts[i])
            self.owned[i] = True
        self.counts[i][value] = self.counts[i].get(value, 0) + delta
        self.min_match[i] = self._min(i)
        self._refresh()


class _ScoreState:
    __slots__ = ("constraints", "ignored", "weights", "counts", "match_counts")

    def __init__(self, constraints: list[SpreadConstraint], ignored: set[str], weights: list[float],
                 counts: list[Mapping[str, int]], match_counts: list[MatchCount | None]) -> None:
        self.constraints = constraints
        self.ignored = ignored
        self.weights = weights
        self.counts = counts
        self.match_counts = match_counts


class PodTopologySpread(PodCountingExtensions):
    name = "PodTopologySpread"
    _key = "PodTopologySpread/filter"
    _score_key = "PodTopologySpread/score"

    def __init__(self, *, default_constraints: Sequence[Mapping[str, Any]] | None = None,
                 defaulting_type: str = DEFAULTING_SYSTEM) -> None:
        if defaulting_type not in (DEFAULTING_SYSTEM, DEFAULTING_LIST):
            raise ValueError(f"defaultingType must be System or List, not {defaulting_type!r}")
        if defaulting_type == DEFAULTING_SYSTEM:
            if default_constraints:
                raise ValueError("defaultConstraints must be empty when defaultingType is System")
            self.default_constraints: tuple[Mapping[str, Any], ...] = SYSTEM_DEFAULT_CONSTRAINTS
        else:
            self.default_constraints = tuple(default_constraints or ())
            for c in self.default_constraints:
                if c.get("labelSelector") is not None:
                    raise ValueError("default constraints must not have a labelSelector")
                parse_constraint(c, {}, selector=LabelSelector())  # validate
        self.system_defaulted = defaulting_type == DEFAULTING_SYSTEM

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> PodTopologySpread:
        """From PodTopologySpreadArgs (`defaultConstraints`, `defaultingType`)."""
        unknown = set(args) - {"defaultConstraints", "defaultingType"}
        if unknown:
            raise ValueError(f"unknown PodTopologySpread args: {sorted(unknown)}")
        return cls(default_constraints=args.get("defaultConstraints"),
                   defaulting_type=args.get("defaultingType") or DEFAULTING_SYSTEM)

    # -- constraints ---------------------------------------------------------------
    def constraints(self, pod: dict[str, Any], action: str) -> list[SpreadConstraint]:
        """The pod's own constraints with this `whenUnsatisfiable`, or the cluster defaults."""
        own = (pod.get("spec") or {}).get("topologySpreadConstraints") or []
        labels = pod_labels(pod)
        if own:
            return [parse_constraint(c, labels) for c in own
                    if isinstance(c, Mapping) and (c.get("whenUnsatisfiable") or DO_NOT_SCHEDULE) == action]
        defaults = [c for c in self.default_constraints if c.get("whenUnsatisfiable", DO_NOT_SCHEDULE) == action]
        if not defaults:
            return []
        selector = default_selector(pod)
        if selector is None:
            return []
        return [parse_constraint(c, labels, selector=selector) for c in defaults]

    @staticmethod
    def _match_counts(snap: Snapshot, pod: dict[str, Any], cs: list[SpreadConstraint]) -> list[MatchCount | None]:
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        return [None if _counts_nothing(c.selector) else
                snap.match_count(((frozenset((ns,)), c.selector),), skip_terminating=True) for c in cs]

    @staticmethod
    def _node_filters(pod: dict[str, Any], cs: list[SpreadConstraint],
                      snap: Snapshot) -> tuple[RequiredNodeAffinity | None, bool]:
        """(node affinity to honour, whether taints must be honoured) for eligibility."""
        required = required_node_affinity(pod.get("spec") or {}) if any(c.honor_node_affinity for c in cs) else None
        taints = any(c.honor_taints for c in cs) and snap.has_hard_taints
        return required, taints

    @staticmethod
    def _eligible(info: NodeInfo, c: SpreadConstraint, required: RequiredNodeAffinity | None,
                  tolerations: list[Any] | None, memo: dict[str, bool]) -> bool:
        if c.honor_node_affinity and required is not None:
            if "affinity" not in memo:
                memo["affinity"] = required.matches(info.labels, info.name)
            if not memo["affinity"]:
                return False
        if c.honor_taints and tolerations is not None:
            if "taints" not in memo:
                memo["taints"] = untolerated_hard_taint(info, tolerations) is None
            if not memo["taints"]:
                return False
        return True

    # -- filter ----------------------------------------------------------------------
    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        try:
            cs = self.constraints(pod, DO_NOT_SCHEDULE)
        except (TypeError, ValueError) as e:
            return Status.error(f"obtaining pod's hard topology spread constraints: {e}")
        if not cs:
            return Status(Code.SKIP)
        snap = cycle_snapshot(state)
        state.write(self._key, (DEFERRED, cs) if snap is None else self._filter_state(pod, cs, snap))
        return Status.success()

    def _filter_state(self, pod: dict[str, Any], cs: list[SpreadConstraint], snap: Snapshot) -> _FilterState:
        mcs = self._match_counts(snap, pod, cs)
        required, taints = self._node_filters(pod, cs, snap)
        keys = {c.topology_key for c in cs}
        labels = pod_labels(pod)
        self_match = [1 if c.selector.matches(labels) else 0 for c in cs]
        counts: list[dict[str, int]] = []
        domains: list[Mapping[str, Any]] = []
        if required is None and not taints and all(snap.nodes_with_label(k) == len(snap) for k in keys):
            # Every node is eligible: the snapshot's aggregates are the answer.
            for c, mc in zip(cs, mcs, strict=True):
                domains.append(snap.label_values(c.topology_key))
                counts.append(mc.topology(c.topology_key) if mc is not None else {})
            return _FilterState(cs, counts, domains, self_match)
        tolerations = pod_tolerations(pod) if taints else None
        per: list[dict[str, int]] = [{} for _ in cs]
        for info in snap.nodes():
            nl = info.labels
            if not all(k in nl for k in keys):
                continue
            memo: dict[str, bool] = {}
            for i, c in enumerate(cs):
                if not self._eligible(info, c, required, tolerations, memo):
                    continue
                v = nl[c.topology_key]
                mc = mcs[i]
                per[i][v] = per[i].get(v, 0) + (mc.per_node.get(info.name, 0) if mc is not None else 0)
        return _FilterState(cs, per, list(per), self_match)

    def _state(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> _FilterState:
        return resolve_deferred(state, self._key, node,
                                lambda arg, snap: self._filter_state(pod, arg, snap), self.name)

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        s = state.read(self._key)
        if s.__class__ is not _FilterState:
            s = self._state(state, pod, node)
        labels = node.labels
        for key, max_skew, counts, self_match, min_match in s.checks:
            value = labels.get(key)
            if value is None:
                return _MISSING_LABEL
            if counts.get(value, 0) + self_match - min_match > max_skew:
                return _NOT_MATCH
        return _SUCCESS

    def update_counts(self, state: CycleState, pod: dict[str, Any], other: dict[str, Any], node: NodeInfo,
                delta: int) -> None:
        if self.name in state.skip_filter:
            return
        s = self._state(state, pod, node)
        if (other.get("metadata") or {}).get("namespace") != (pod.get("metadata") or {}).get("namespace"):
            return
        labels = node.labels
        if not all(c.topology_key in labels for c in s.constraints):
            return
        required, _ = self._node_filters(pod, s.constraints, node.snapshot or Snapshot())
        tolerations = pod_tolerations(pod)
        other_labels = pod_labels(other)
        memo: dict[str, bool] = {}
        for i, c in enumerate(s.constraints):
            if c.selector.matches(other_labels) and self._eligible(node, c, required, tolerations, memo):
                s.bump(i, labels[c.topology_key], delta)

    # -- score -----------------------------------------------------------------------
    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        try:
            cs = self.constraints(pod, SCHEDULE_ANYWAY)
        except (TypeError, ValueError):
            return Status(Code.SKIP)  # pre_filter already reported it
        snap = cycle_snapshot(state, nodes)
        if not cs or snap is None or not nodes:
            return Status(Code.SKIP)
        # Only the pod's own constraints demand every topology label; the
        # system defaults still spread by hostname on nodes without a zone.
        require_all = bool((pod.get("spec") or {}).get("topologySpreadConstraints")) or not self.system_defaulted
        keys = [c.topology_key for c in cs]
        hosts = [k == HOSTNAME_LABEL for k in keys]
        ignored: set[str] = set()
        values: list[set[str]] = [set() for _ in cs]
        for n in nodes:
            nl = n.labels
            if require_all and not all(k in nl for k in keys):
                ignored.add(n.name)
                continue
            for i, k in enumerate(keys):
                if not hosts[i]:
                    values[i].add(nl.get(k, ""))
        scored = len(nodes) - len(ignored)
        weights = [math.log((scored if hosts[i] else len(values[i])) + 2) for i in range(len(cs))]
        mcs = self._match_counts(snap, pod, cs)
        required, taints = self._node_filters(pod, cs, snap)
        counts: list[Mapping[str, int]] = []
        if required is None and not taints and all(snap.nodes_with_label(k) == len(snap) for k in keys):
            for i, k in enumerate(keys):
                mc = mcs[i]
                counts.append({} if hosts[i] or mc is None else mc.topology(k))
        else:
            tolerations = pod_tolerations(pod) if taints else None
            per: list[dict[str, int]] = [{} for _ in cs]
            for info in snap.nodes():
                nl = info.labels
                if require_all and not all(k in nl for k in keys):
                    continue
                memo: dict[str, bool] = {}
                for i, c in enumerate(cs):
                    mc = mcs[i]
                    if hosts[i] or mc is None or not self._eligible(info, c, required, tolerations, memo):
                        continue
                    v = nl.get(c.topology_key, "")
                    if v in values[i]:
                        per[i][v] = per[i].get(v, 0) + mc.per_node.get(info.name, 0)
            counts = list(per)
        state.write(self._score_key, _ScoreState(cs, ignored, weights, counts, mcs))
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        s: _ScoreState = state.read(self._score_key)
        name = node.name
        if name in s.ignored:
            return 0
        labels = node.labels
        total = 0.0
        for i, c in enumerate(s.constraints):
            value = labels.get(c.topology_key)
            if value is None:
                continue
            if c.topology_key == HOSTNAME_LABEL:
                mc = s.match_counts[i]
                cnt = mc.per_node.get(name, 0) if mc is not None else 0
            else:
                cnt = s.counts[i].get(value, 0)
            total += cnt * s.weights[i] + (c.max_skew - 1)
        return go_round(total)

    def normalize_score(self, state: CycleState, pod: dict[str, Any], scores: dict[str, int]) -> None:
        s: _ScoreState = state.read(self._score_key)
        live = [v for name, v in scores.items() if name not in s.ignored]
        if not live:
            for name in scores:
                scores[name] = 0
            return
        lowest, highest = min(live), max(live)
        for name, v in scores.items():
            if name in s.ignored:
                scores[name] = 0
            elif highest == 0:
                scores[name] = MAX_NODE_SCORE
            else:
                scores[name] = MAX_NODE_SCORE * (highest + lowest - v) // highest
