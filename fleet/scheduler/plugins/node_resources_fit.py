"""NodeResourcesFit: the pod's requests must fit in what the node has left; score by allocation.

Filter: for every resource the pod requests (cpu, memory, ephemeral-storage,
extended resources), `allocatable - requested by bound pods >= pod request`,
and the node's `pods` allocatable must leave room for one more pod.  One
status carries every shortfall ("Insufficient cpu", "Insufficient memory"),
so the FailedScheduling message counts each.  Extended resources listed in
`ignoredResources`, or whose prefix (`example.com` of `example.com/gpu`) is in
`ignoredResourceGroups`, are not checked — they are managed by an extender.

Score (`scoringStrategy`, as kube-scheduler's NodeResourcesFitArgs):

- `LeastAllocated` (default): the share of each resource left free after
  placing the pod, weighted-averaged — spreads pods over the emptier nodes;
- `MostAllocated`: the share used — packs pods onto fuller nodes (bin
  packing, to let an autoscaler drain the rest);
- `RequestedToCapacityRatio`: a piecewise-linear `shape` from utilization
  (0..100) to score (0..10), for anything in between.

The scored resources and their weights default to cpu and memory, weight 1.
Scoring uses the non-zero requests for cpu and memory (100m / 200Mi for a
container without requests), or a node of BestEffort pods would always look
empty.  An extended resource the pod does not request is left out of its
score, so GPU nodes are not penalized for non-GPU pods.

Status code: a shortfall is Unschedulable (preemption may free room).
Kubernetes >= 1.31 reports UnschedulableAndUnresolvable when the request
exceeds the node's whole allocatable; we keep the older code for now (the
queue and preemption treat both alike until preemption lands).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.scheduler.framework import MAX_NODE_SCORE, CycleState, Status
from fleet.scheduler.plugins._scoring import go_div, go_round
from fleet.scheduler.podinfo import Resources, pod_requests
from fleet.scheduler.snapshot import NodeInfo

TOO_MANY_PODS = "Too many pods"
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
REQUESTED_TO_CAPACITY_RATIO = "RequestedToCapacityRatio"
STRATEGIES = (LEAST_ALLOCATED, MOST_ALLOCATED, REQUESTED_TO_CAPACITY_RATIO)

# RequestedToCapacityRatio shape scores are 0..10 (MaxCustomPriorityScore);
# they are scaled to 0..MAX_NODE_SCORE.
MAX_CUSTOM_PRIORITY_SCORE = 10
MAX_UTILIZATION = 100

NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")
SCORED_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True)
class ResourceSpec:
    name: str
    weight: int = 1


DEFAULT_RESOURCES = (ResourceSpec("cpu", 1), ResourceSpec("memory", 1))


def insufficient(resource: str) -> str:
    return f"Insufficient {resource}"


def is_scalar_resource(name: str) -> bool:
    """Extended resources, hugepages and the like: anything but cpu/memory/ephemeral-storage/pods."""
    return name not in NATIVE_RESOURCES


def _check_order(resource: str) -> tuple[int, str]:
    # kube-scheduler checks cpu, memory, ephemeral-storage, then the rest.
    native = ("cpu", "memory", "ephemeral-storage")
    return (native.index(resource), "") if resource in native else (len(native), resource)


def fit_reasons(requests: Resources, node: NodeInfo, *, ignored: frozenset[str] = frozenset(),
                ignored_groups: frozenset[str] = frozenset()) -> list[str]:
    """Every reason the pod does not fit on the node (empty: it fits)."""
    reasons = []
    if len(node.pods) + 1 > node.allocatable.get("pods", 0):
        reasons.append(TOO_MANY_PODS)
    for resource in sorted(requests, key=_check_order):
        want = requests[resource]
        if resource == "pods" or want <= 0:
            continue
        if is_scalar_resource(resource) and (
                resource in ignored or (ignored_groups and resource.split("/", 1)[0] in ignored_groups)):
            continue
        free = node.allocatable.get(resource, 0) - node.requested.get(resource, 0)
        if want > free:
            reasons.append(insufficient(resource))
    return reasons


# ---------------------------------------------------------------------------
# Per-resource scores and strategies (kube-scheduler's resource_allocation.go).
# ---------------------------------------------------------------------------


def least_requested_score(requested: int, capacity: int) -> int:
    """The free share of one resource, 0..100; an over-committed resource scores 0."""
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def most_requested_score(requested: int, capacity: int) -> int:
    """The used share of one resource, 0..100; over-commitment (non-zero defaults) counts as full."""
    if capacity == 0:
        return 0
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def _weighted(per_resource: Any, resources: Sequence[ResourceSpec], requested: Sequence[int],
              allocatable: Sequence[int]) -> int:
    total = weights = 0
    for spec, req, alloc in zip(resources, requested, allocatable, strict=True):
        if alloc == 0:
            continue
        total += per_resource(req, alloc) * spec.weight
        weights += spec.weight
    return total // weights if weights else 0


def least_allocated(requested: Mapping[str, int], allocatable: Mapping[str, int],
                    resources: Sequence[ResourceSpec] = DEFAULT_RESOURCES) -> int:
    """Weighted average of the free share (0..100) after placement; resources a node lacks are skipped."""
    return _weighted(least_requested_score, resources, [requested.get(r.name, 0) for r in resources],
                     [allocatable.get(r.name, 0) for r in resources])


def most_allocated(requested: Mapping[str, int], allocatable: Mapping[str, int],
                   resources: Sequence[ResourceSpec] = DEFAULT_RESOURCES) -> int:
    """Weighted average of the used share (0..100) after placement."""
    return _weighted(most_requested_score, resources, [requested.get(r.name, 0) for r in resources],
                     [allocatable.get(r.name, 0) for r in resources])


def broken_linear(shape: Sequence[tuple[int, int]], p: int) -> int:
    """Piecewise-linear interpolation through (utilization, score) points, flat outside them."""
    for i, (util, score) in enumerate(shape):
        if p <= util:
            if i == 0:
                return score
            u0, s0 = shape[i - 1]
            return s0 + go_div((score - s0) * (p - u0), util - u0)
    return shape[-1][1]


def requested_to_capacity_ratio(shape: Sequence[tuple[int, int]], requested: Mapping[str, int],
                                allocatable: Mapping[str, int],
                                resources: Sequence[ResourceSpec] = DEFAULT_RESOURCES) -> int:
    """RequestedToCapacityRatio with `shape` already scaled to 0..MAX_NODE_SCORE scores.

    As upstream, resources scoring 0 drop out of the weighted average, and
    the average is rounded rather than truncated.
    """
    total = weights = 0
    for spec in resources:
        alloc = allocatable.get(spec.name, 0)
        if alloc == 0:
            continue
        req = requested.get(spec.name, 0)
        util = MAX_UTILIZATION if req > alloc else req * MAX_UTILIZATION // alloc
        score = broken_linear(shape, util)
        if score > 0:
            total += score * spec.weight
            weights += spec.weight
    return go_round(total / weights) if weights else 0


def parse_resources(raw: Any) -> tuple[ResourceSpec, ...]:
    """`[{name, weight}]` as in NodeResourcesFitArgs; weights 1..100, names unique."""
    if raw is None:
        return DEFAULT_RESOURCES
    if not isinstance(raw, list) or not raw:
        raise ValueError("resources must be a non-empty list of {name, weight}")
    out: list[ResourceSpec] = []
    for r in raw:
        if not isinstance(r, Mapping) or not r.get("name"):
            raise ValueError(f"invalid resource spec {r!r}")
        weight = int(r.get("weight", 1))
        if not 1 <= weight <= 100:
            raise ValueError(f"resource {r['name']}: weight must be in 1..100, not {weight}")
        out.append(ResourceSpec(str(r["name"]), weight))
    if len({r.name for r in out}) != len(out):
        raise ValueError("resources must not repeat a name")
    return tuple(out)


def parse_shape(raw: Any) -> tuple[tuple[int, int], ...]:
    """A RequestedToCapacityRatio shape, scaled to 0..MAX_NODE_SCORE scores."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("requestedToCapacityRatio.shape must be a non-empty list")
    points = []
    for p in raw:
        if not isinstance(p, Mapping):
            raise ValueError(f"invalid shape point {p!r}")
        util, score = int(p.get("utilization", 0)), int(p.get("score", 0))
        if not 0 <= util <= MAX_UTILIZATION:
            raise ValueError(f"shape utilization must be in 0..100, not {util}")
        if not 0 <= score <= MAX_CUSTOM_PRIORITY_SCORE:
            raise ValueError(f"shape score must be in 0..10, not {score}")
        if points and util <= points[-1][0]:
            raise ValueError("shape utilization values must be strictly increasing")
        points.append((util, score * (MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE)))
    return tuple(points)


def scoring_request(node: NodeInfo, resource: str, pod_request: int, *, use_requested: bool) -> tuple[int, int]:
    """(allocatable, requested after placement) for scoring one resource; (0, 0) leaves it out.

    cpu and memory use the non-zero bookkeeping unless `use_requested`; an
    extended resource the pod does not request is left out.
    """
    if pod_request == 0 and is_scalar_resource(resource):
        return 0, 0
    alloc = node.allocatable.get(resource, 0)
    if resource in SCORED_RESOURCES and not use_requested:
        return alloc, node.non_zero_requested.get(resource, 0) + pod_request
    return alloc, node.requested.get(resource, 0) + pod_request


class NodeResourcesFit:
    name = "NodeResourcesFit"
    _requests = "NodeResourcesFit/requests"
    _score = "NodeResourcesFit/score"

    def __init__(self, *, scoring_strategy: Mapping[str, Any] | None = None,
                 ignored_resources: Sequence[str] = (), ignored_resource_groups: Sequence[str] = ()) -> None:
        raw = dict(scoring_strategy or {})
        self.strategy = str(raw.get("type") or LEAST_ALLOCATED)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"scoringStrategy.type must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        self.resources = parse_resources(raw.get("resources"))
        self.shape: tuple[tuple[int, int], ...] = ()
        if self.strategy == REQUESTED_TO_CAPACITY_RATIO:
            self.shape = parse_shape((raw.get("requestedToCapacityRatio") or {}).get("shape"))
        self.ignored = frozenset(ignored_resources)
        self.ignored_groups = frozenset(ignored_resource_groups)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> NodeResourcesFit:
        """From NodeResourcesFitArgs (camelCase keys)."""
        unknown = set(args) - {"scoringStrategy", "ignoredResources", "ignoredResourceGroups"}
        if unknown:
            raise ValueError(f"unknown NodeResourcesFit args: {sorted(unknown)}")
        return cls(scoring_strategy=args.get("scoringStrategy"),
                   ignored_resources=args.get("ignoredResources") or (),
                   ignored_resource_groups=args.get("ignoredResourceGroups") or ())

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        requests = pod_requests(pod)
        # The resources to check, in kube-scheduler's order, resolved once per cycle.
        checks = [(r, requests[r]) for r in sorted(requests, key=_check_order)
                  if r != "pods" and requests[r] > 0 and not (is_scalar_resource(r) and (
                      r in self.ignored or r.split("/", 1)[0] in self.ignored_groups))]
        state.write(self._requests, checks)
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        allocatable, requested = node.allocatable, node.requested
        reasons = None
        if len(node.pods) + 1 > allocatable.get("pods", 0):
            reasons = [TOO_MANY_PODS]
        for resource, want in state.read(self._requests):
            if want > allocatable.get(resource, 0) - requested.get(resource, 0):
                if reasons is None:
                    reasons = []
                reasons.append(insufficient(resource))
        return Status.unschedulable(*reasons) if reasons else Status.success()

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        non_zero = pod_requests(pod, non_zero=True)
        plain = pod_requests(pod)
        # (resource, weight, pod request, counts non-zero bookkeeping), without
        # the extended resources the pod does not request.
        specs = []
        for r in self.resources:
            nz = r.name in SCORED_RESOURCES
            want = non_zero.get(r.name, 0) if nz else plain.get(r.name, 0)
            if want or not is_scalar_resource(r.name):
                specs.append((r.name, r.weight, want, nz))
        state.write(self._score, specs)
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        specs: list[tuple[str, int, int, bool]] = state.read(self._score)
        allocatable, non_zero, plain = node.allocatable, node.non_zero_requested, node.requested
        if self.strategy == REQUESTED_TO_CAPACITY_RATIO:
            requested, alloc_of, weights = {}, {}, []
            for name, weight, want, nz in specs:
                alloc = allocatable.get(name, 0)
                if alloc:
                    alloc_of[name] = alloc
                    requested[name] = (non_zero if nz else plain).get(name, 0) + want
                    weights.append(ResourceSpec(name, weight))
            return requested_to_capacity_ratio(self.shape, requested, alloc_of, weights)
        per_resource = least_requested_score if self.strategy == LEAST_ALLOCATED else most_requested_score
        total = weight_sum = 0
        for name, weight, want, nz in specs:
            alloc = allocatable.get(name, 0)
            if alloc:
                total += per_resource((non_zero if nz else plain).get(name, 0) + want, alloc) * weight
                weight_sum += weight
        return total // weight_sum if weight_sum else 0
