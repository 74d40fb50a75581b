"""The scheduling framework: statuses, per-cycle state, plugin protocols and the pipeline.

Everything here is pure: a scheduling cycle is `Framework.schedule(pod,
snapshot)`, a function of the pod and a read-only `Snapshot` of the cluster
(Nomad `scheduler/structs/interfaces.go`; Kubernetes
`pkg/scheduler/framework/interface.go`).  No I/O and no awaits happen inside
a cycle, so the snapshot cannot change under it and the whole decision can be
tested table-driven.  The I/O loop (`fleet.scheduler.run`) builds the
snapshot from its informers, calls `schedule`, and binds the result.

A plugin is a small class with a `name` and only the extension points it
needs, each one an optional method:

- `pre_filter(state, pod) -> Status` — once per cycle: precompute what
  `filter` needs into the CycleState, or reject the pod outright;
- `filter(state, pod, node) -> Status` — can the pod run on this node?
- `pre_score(state, pod, nodes) -> Status` — once per cycle over the feasible nodes;
- `score(state, pod, node) -> int` — how good is this node, 0..MAX_NODE_SCORE;
- `normalize_score(state, pod, scores) -> None` — rescale this plugin's
  scores in place to 0..MAX_NODE_SCORE.

- `post_filter(state, pod, snapshot, diagnosis) -> Nomination | None` — runs
  only when no node fits: may propose a node where evicting some pods would
  make room (preemption, `fleet.scheduler.preemption`).  It only *proposes*;
  the I/O loop deletes the victims and records `nominatedNodeName`.

After a node is chosen (the binding cycle, `fleet.scheduler.run`):

- `reserve(state, pod, node) -> Status` / `unreserve(state, pod, node)` — still
  synchronous, right after the pod is assumed on its node: record what this pod
  takes (VolumeBinding promises its PersistentVolumes) so the next cycles do not
  hand it to another pod; unreserve undoes it when binding fails;
- `async pre_bind(state, pod, node, handle) -> Status` — the only awaiting point,
  run before the Binding is posted: API writes the binding depends on, and waiting
  for them (VolumeBinding binds volumes and waits for the claims to be bound).
  `handle` (a `BindHandle`) carries the client, the live snapshot and the limits.
  A failure fails the binding and the pod is retried.

The queue-sort point is the scheduling queue's priority order.  The cycle's
`Snapshot` is on `state.snapshot` for plugins that need cluster-wide data
(InterPodAffinity, PodTopologySpread).  Pods nominated to a node (preemptors
waiting for their victims to go) count on that node for every pod of lower or
equal priority, so the room made by preemption is not taken by someone else.
"""

from __future__ import annotations

import abc
import enum
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fleet.scheduler.snapshot import NodeInfo, Snapshot

MAX_NODE_SCORE = 100


class Code(enum.Enum):
    """Outcome of one plugin call (Kubernetes' framework.Code)."""

    SUCCESS = "Success"
    # The pod does not fit now; a cluster change (a pod leaving, a node
    # growing) may make it fit, and preemption may help.
    UNSCHEDULABLE = "Unschedulable"
    # No change to other pods can help (wrong node name, labels, cordoned):
    # preemption skips such nodes.
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    # The plugin itself failed (malformed input); the pod is retried with back-off.
    ERROR = "Error"
    # The plugin has nothing to say about this pod; its later points are skipped.
    SKIP = "Skip"


@dataclass(frozen=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @classmethod
    def success(cls) -> Status:
        return _SUCCESS

    @classmethod
    def unschedulable(cls, *reasons: str, unresolvable: bool = False) -> Status:
        code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE
        return cls(code, tuple(reasons))

    @classmethod
    def error(cls, reason: str) -> Status:
        return cls(Code.ERROR, (reason,))

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)

    def with_plugin(self, name: str) -> Status:
        return self if self.plugin or self.ok else Status(self.code, self.reasons, name)


_SUCCESS = Status()


class CycleState:
    """Per-cycle scratch space, keyed by plugin name.

    Written by a plugin's `pre_filter`/`pre_score` and read by its `filter`
    and `score` for every node, so per-pod work (summing requests, parsing
    affinity) happens once per cycle instead of once per node.
    """

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self._data: dict[str, Any] = {}
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()
        self.snapshot = snapshot
        # Filled by Framework.run_filters on first use, after the pre-filters ran.
        self.active_filters: list[Any] | None = None
        self.active_filters_for: Any = None

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def read(self, key: str) -> Any:
        """The value a plugin stored; KeyError means its pre_* point did not run."""
        return self._data[key]


# ---------------------------------------------------------------------------
# Plugin protocols.  A plugin implements any subset; the Framework sorts
# plugins into the extension points by which methods they have.
# ---------------------------------------------------------------------------


@runtime_checkable
class Plugin(Protocol):
    name: str


class PodCountingExtensions(abc.ABC):
    """PreFilterExtensions (AddPod/RemovePod) of a plugin whose pre-filter state counts
    matching pods per topology value — InterPodAffinity and PodTopologySpread.  Preemption
    asks such a plugin to count a pod as added to, or removed from, a node; both are one
    `update_counts` with a delta of +1 or -1."""

    def add_pod(self, state: CycleState, pod: dict[str, Any], other: dict[str, Any],
                node: NodeInfo) -> Status:
        """Pre-filter extension (for preemption): count `other` as if bound to `node`."""
        self.update_counts(state, pod, other, node, 1)
        return Status.success()

    def remove_pod(self, state: CycleState, pod: dict[str, Any], other: dict[str, Any],
                   node: NodeInfo) -> Status:
        """Pre-filter extension (for preemption): stop counting `other` on `node`."""
        self.update_counts(state, pod, other, node, -1)
        return Status.success()

    @abc.abstractmethod
    def update_counts(self, state: CycleState, pod: dict[str, Any], other: dict[str, Any],
                      node: NodeInfo, delta: int) -> None:
        """Add `delta` to the counts `other` contributes on `node` (the plugin's own rule)."""


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status: ...


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status: ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int: ...


@runtime_checkable
class NormalizeScorePlugin(Plugin, Protocol):
    def normalize_score(self, state: CycleState, pod: dict[str, Any], scores: dict[str, int]) -> None: ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, state: CycleState, pod: dict[str, Any], node: str) -> Status: ...

    def unreserve(self, state: CycleState, pod: dict[str, Any], node: str) -> None: ...


@dataclass
class BindHandle:
    """What a pre-bind plugin may use: the API client (`replace`, `patch`, ...), the
    live snapshot the informers keep current, how long it may wait and how often it
    looks, and `pod_exists()` (False once the pod was deleted meanwhile)."""

    client: Any
    snapshot: Snapshot
    timeout: float = 60.0
    poll_interval: float = 0.2
    pod_exists: Callable[[], bool] = lambda: True


@runtime_checkable
class PreBindPlugin(Plugin, Protocol):
    async def pre_bind(self, state: CycleState, pod: dict[str, Any], node: str,
                       handle: BindHandle) -> Status: ...


@dataclass(frozen=True)
class Nomination:
    """A post-filter's proposal: run the pod on `node` once `victims` are gone."""

    node: str
    victims: tuple[dict[str, Any], ...]


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(self, framework: Framework, pod: dict[str, Any], snapshot: Snapshot,
                    diagnosis: Diagnosis) -> Nomination | None: ...


# ---------------------------------------------------------------------------
# Results.
# ---------------------------------------------------------------------------


@dataclass
class Diagnosis:
    """Why no node fit: each rejected node's status, and a pre-filter rejection if any."""

    node_statuses: dict[str, Status] = field(default_factory=dict)
    pre_filter: Status | None = None


@dataclass
class FitError(Exception):
    """No node fits the pod; `str()` is the FailedScheduling event message."""

    num_all_nodes: int
    diagnosis: Diagnosis

    def __str__(self) -> str:
        return fit_error_message(self.num_all_nodes, self.diagnosis)

    @property
    def unresolvable(self) -> bool:
        """True when no cluster change short of a node change can help (for the queue)."""
        statuses = list(self.diagnosis.node_statuses.values())
        if self.diagnosis.pre_filter is not None:
            statuses.append(self.diagnosis.pre_filter)
        return bool(statuses) and all(s.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE for s in statuses)


def fit_error_message(num_all_nodes: int, diagnosis: Diagnosis) -> str:
    """Kubernetes' FitError.Error(): "0/3 nodes are available: 1 <reason>, 2 <reason>."

    Each node counts once per distinct reason it reported; the "<count>
    <reason>" strings are sorted as strings, exactly as kube-scheduler sorts
    them, so messages are stable and match what users already grep for.
    """
    msg = f"0/{num_all_nodes} nodes are available:"
    if diagnosis.pre_filter is not None and diagnosis.pre_filter.reasons:
        return msg + " " + ", ".join(diagnosis.pre_filter.reasons) + "."
    histogram: Counter[str] = Counter()
    for status in diagnosis.node_statuses.values():
        for reason in dict.fromkeys(status.reasons):
            histogram[reason] += 1
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    if not parts:
        # No node at all, or nodes rejected without a reason: still end the sentence.
        return msg[:-1] + "."
    return msg + " " + ", ".join(parts) + "."


@dataclass(frozen=True)
class ScheduleResult:
    node: str
    evaluated_nodes: int
    feasible_nodes: int
    # The cycle's state, for the binding cycle's reserve and pre-bind points.
    state: CycleState | None = field(default=None, compare=False, repr=False)


# kube-scheduler's defaults for how many feasible nodes are enough to score.
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5


def num_feasible_nodes_to_find(num_all_nodes: int, percentage: int = 0) -> int:
    """How many feasible nodes to look for before scoring (percentageOfNodesToScore).

    Small clusters are searched whole.  From 100 nodes on, the search stops after
    `percentage`% of them were found feasible; 0 means Kubernetes' adaptive default,
    50% at 100 nodes falling by 1% per 125 nodes to a floor of 5% (10% at 5,000),
    and never fewer than 100 nodes.  A big cluster then costs a bounded slice per
    pod, while the rotating start index spreads the slices over every node.
    """
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return num_all_nodes
    if percentage <= 0:
        percentage = max(50 - num_all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(num_all_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def pod_priority(pod: dict[str, Any]) -> int:
    """spec.priority (the Priority admission plugin resolves it from the class); 0 if unset."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


# ---------------------------------------------------------------------------
# The framework.
# ---------------------------------------------------------------------------


class Framework:
    """Runs a profile's plugins over a snapshot; one instance per scheduler profile."""

    def __init__(self, plugins: Iterable[Plugin], *, weights: dict[str, int] | None = None,
                 rng: random.Random | None = None, percentage_of_nodes_to_score: int = 0) -> None:
        self.plugins = list(plugins)
        names = [p.name for p in self.plugins]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate plugin names in profile: {names}")
        self.weights = {p.name: (weights or {}).get(p.name, 1) for p in self.plugins}
        self.pre_filters = [p for p in self.plugins if isinstance(p, PreFilterPlugin)]
        self.filters = [p for p in self.plugins if isinstance(p, FilterPlugin)]
        self.pre_scores = [p for p in self.plugins if isinstance(p, PreScorePlugin)]
        self.scorers = [p for p in self.plugins if isinstance(p, ScorePlugin)]
        self.post_filters = [p for p in self.plugins if isinstance(p, PostFilterPlugin)]
        self.reservers = [p for p in self.plugins if isinstance(p, ReservePlugin)]
        self.pre_binders = [p for p in self.plugins if isinstance(p, PreBindPlugin)]
        self.rng = rng or random.Random()
        self.percentage_of_nodes_to_score = percentage_of_nodes_to_score
        self._next_start = 0  # where the next cycle's node search begins
        # node name -> pods nominated to it (preemptors waiting for their victims)
        self.nominated: dict[str, dict[str, dict[str, Any]]] = {}

    # -- nominated pods (kept by the I/O loop) -----------------------------------------
    def nominate(self, pod: dict[str, Any], node: str | None) -> None:
        """Record (or, with None, clear) that `pod` waits for room on `node`."""
        key = _key(pod)
        for pods in self.nominated.values():
            pods.pop(key, None)
        self.nominated = {n: ps for n, ps in self.nominated.items() if ps}
        if node:
            self.nominated.setdefault(node, {})[key] = pod

    def _nominated_for(self, pod: dict[str, Any], node: str) -> list[dict[str, Any]]:
        if not self.nominated:
            return []
        pods = self.nominated.get(node)
        if not pods:
            return []
        key, prio = _key(pod), pod_priority(pod)
        return [p for k, p in pods.items() if k != key and pod_priority(p) >= prio]

    def schedule(self, pod: dict[str, Any], snapshot: Snapshot) -> ScheduleResult:
        """Pick the node for `pod`, or raise FitError saying why none fits."""
        nodes = snapshot.nodes()
        diagnosis = Diagnosis()
        if not nodes:
            raise FitError(0, diagnosis)
        state = CycleState(snapshot)

        # Stage 1 — pre-filter: per-pod work once (requests summed, selectors
        # parsed) before the per-node loop; a plugin may reject the pod for
        # every node at once, or say it has nothing to check (SKIP).
        for p in self.pre_filters:
            st = p.pre_filter(state, pod).with_plugin(p.name)
            if st.code is Code.SKIP:
                state.skip_filter.add(p.name)
            elif not st.ok:
                diagnosis.pre_filter = st
                raise FitError(len(nodes), diagnosis)

        # Stage 2 — filter: filters run in profile order, cheapest first, and
        # a node stops at its first failing filter — except that one filter
        # may report several reasons (NodeResourcesFit: cpu *and* memory),
        # which the FailedScheduling message counts separately.  A pod
        # nominated to a node (it preempted there) tries that node first.  In
        # a big cluster the search stops once enough feasible nodes were found
        # (percentageOfNodesToScore), starting where the last cycle stopped.
        feasible: list[NodeInfo] = []
        want = num_feasible_nodes_to_find(len(nodes), self.percentage_of_nodes_to_score)
        nominated_node = ((pod.get("status") or {}).get("nominatedNodeName") or "")
        if nominated_node and (info := snapshot.get(nominated_node)) is not None:
            if self.run_filters_with_nominated(state, pod, info).ok:
                return ScheduleResult(info.name, 1, 1, state)
        start = self._next_start % len(nodes)
        examined = 0
        for i in range(len(nodes)):
            node = nodes[(start + i) % len(nodes)]
            examined += 1
            st = self.run_filters_with_nominated(state, pod, node)
            if st.ok:
                feasible.append(node)
                if len(feasible) >= want:
                    break
            else:
                diagnosis.node_statuses[node.name] = st
        self._next_start = (start + examined) % len(nodes)
        if not feasible:
            raise FitError(len(nodes), diagnosis)

        # Stage 3 — a single feasible node needs no scoring (kube-scheduler
        # returns early the same way); this is also the common case for pods
        # pinned by selectors.
        if len(feasible) == 1:
            return ScheduleResult(feasible[0].name, examined, 1, state)

        # Stage 4 — pre-score, score, normalize, weight: each plugin scores
        # every feasible node 0..100, normalizes its own scores, and the
        # weighted sum decides.
        totals = self.score(state, pod, feasible)

        # Stage 5 — select: the best total; ties are broken at random so equal
        # nodes share the load instead of the first one taking everything.
        return ScheduleResult(select_host(totals, self.rng), examined, len(feasible), state)

    # -- the binding cycle -----------------------------------------------------------
    def reserve(self, state: CycleState, pod: dict[str, Any], node: str) -> Status:
        """Every reserve plugin that did not skip this pod; on a failure, the ones that
        already reserved are unreserved (in reverse) and the failure returned."""
        done: list[ReservePlugin] = []
        for p in self.reservers:
            if p.name in state.skip_filter:
                continue
            st = p.reserve(state, pod, node).with_plugin(p.name)
            if not st.ok:
                for q in reversed(done):
                    q.unreserve(state, pod, node)
                return st
            done.append(p)
        return _SUCCESS

    def unreserve(self, state: CycleState, pod: dict[str, Any], node: str) -> None:
        for p in reversed(self.reservers):
            if p.name not in state.skip_filter:
                p.unreserve(state, pod, node)

    def pre_binders_for(self, state: CycleState | None) -> list[PreBindPlugin]:
        """The pre-bind plugins with something to do for this cycle's pod (a plugin
        whose pre-filter skipped the pod has none), so pods without any bind fast."""
        if state is None:
            return []
        return [p for p in self.pre_binders if p.name not in state.skip_filter]

    async def pre_bind(self, state: CycleState, pod: dict[str, Any], node: str,
                       handle: BindHandle) -> Status:
        """Run the pre-bind plugins in order; the first failure is returned with
        kube-scheduler's wording, `running PreBind plugin "<name>": <reason>`."""
        for p in self.pre_binders_for(state):
            st = await p.pre_bind(state, pod, node, handle)
            if not st.ok:
                reason = "; ".join(st.reasons)
                return Status(st.code, (f'running PreBind plugin "{p.name}": {reason}',), p.name)
        return _SUCCESS

    def post_filter(self, pod: dict[str, Any], snapshot: Snapshot,
                    error: FitError) -> Nomination | None:
        """After a FitError: the first post-filter's proposal (preemption), if any."""
        for p in self.post_filters:
            nomination = p.post_filter(self, pod, snapshot, error.diagnosis)
            if nomination is not None:
                return nomination
        return None

    def run_filters_with_nominated(self, state: CycleState, pod: dict[str, Any],
                                   node: NodeInfo) -> Status:
        """The filters, with the node's nominated pods of >= priority counted as there.

        As kube-scheduler does, a node with such pods must pass both with them (so
        the preemptor's room is kept) and without them (so pods that only fit
        *because* of a nominated pod, e.g. by affinity to it, are not placed)."""
        extra = self._nominated_for(pod, node.name)
        if not extra:
            return self.run_filters(state, pod, node)
        snapshot = state.snapshot
        added = []
        try:
            for p in extra:
                assumed = {**p, "spec": {**(p.get("spec") or {}), "nodeName": node.name}}
                if snapshot is not None:
                    snapshot.set_pod(assumed)
                else:
                    node.add_pod(assumed)
                added.append(assumed)
            with_nominated, st = self.run_pre_filters(pod, snapshot)
            if st.ok:
                st = self.run_filters(with_nominated, pod, node)
        finally:
            for p in added:
                if snapshot is not None:
                    snapshot.remove_pod(_key(p))
                else:
                    node.remove_pod(_key(p))
        if not st.ok:
            return st
        return self.run_filters(state, pod, node)

    def run_pre_filters(self, pod: dict[str, Any],
                        snapshot: Snapshot | None) -> tuple[CycleState, Status]:
        """A fresh CycleState with every pre-filter run (for dry runs: preemption,
        nominated pods); the first rejection, if any."""
        state = CycleState(snapshot)
        for p in self.pre_filters:
            st = p.pre_filter(state, pod).with_plugin(p.name)
            if st.code is Code.SKIP:
                state.skip_filter.add(p.name)
            elif not st.ok:
                return state, st
        return state, Status.success()

    def run_filters(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        # The filters that did not SKIP, listed once per cycle: this loop runs for
        # hundreds of nodes per pod, so per-node overhead is most of a cycle's cost.
        active = state.active_filters
        if active is None or state.active_filters_for is not self:
            active = state.active_filters = [p for p in self.filters
                                             if p.name not in state.skip_filter]
            state.active_filters_for = self
        for p in active:
            st = p.filter(state, pod, node)
            if st is not _SUCCESS and not st.ok:
                return st.with_plugin(p.name)
        return _SUCCESS

    def score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> dict[str, int]:
        for p in self.pre_scores:
            st = p.pre_score(state, pod, nodes)
            if st.code is Code.SKIP:
                state.skip_score.add(p.name)
        totals = {n.name: 0 for n in nodes}
        for p in self.scorers:
            if p.name in state.skip_score:
                continue
            scores = {n.name: p.score(state, pod, n) for n in nodes}
            if isinstance(p, NormalizeScorePlugin):
                p.normalize_score(state, pod, scores)
            weight = self.weights[p.name]
            for name, s in scores.items():
                if not 0 <= s <= MAX_NODE_SCORE:
                    raise ValueError(f"plugin {p.name} scored node {name} {s}, outside 0..{MAX_NODE_SCORE}")
                totals[name] += s * weight
        return totals


def _key(pod: dict[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def select_host(totals: dict[str, int], rng: random.Random) -> str:
    """The highest-scoring node; a uniform pick among equals."""
    best = max(totals.values())
    top = sorted(name for name, s in totals.items() if s == best)
    return top[0] if len(top) == 1 else rng.choice(top)
