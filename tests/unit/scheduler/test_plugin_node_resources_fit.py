"""NodeResourcesFit (filter, scoring strategies) and NodeResourcesBalancedAllocation.

Expected scores are kube-scheduler's (least_allocated_test.go,
most_allocated_test.go, balanced_allocation_test.go use the same clusters).
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.scheduler.framework import Code
from fleet.scheduler.plugins.node_resources_balanced_allocation import (
    NodeResourcesBalancedAllocation,
    balanced_score,
)
from fleet.scheduler.plugins.node_resources_fit import (
    NodeResourcesFit,
    broken_linear,
    most_allocated,
    parse_shape,
    requested_to_capacity_ratio,
)
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import container, filter_nodes, node, pod, score_nodes

GPU = "example.com/gpu"


def gpu_pod(n: str = "1", **kw: Any) -> dict[str, Any]:
    return pod(containers=[{"name": "c", "resources": {"requests": {GPU: n, **kw}}}])


# -------------------------------------------------------------------- filter
@pytest.mark.parametrize(("plugin", "n", "p", "reasons"), [
    # Extended resources: absent on the node means zero.
    (NodeResourcesFit(), node("n1"), gpu_pod(), ("Insufficient example.com/gpu",)),
    (NodeResourcesFit(), node("n1", **{GPU: "1"}), gpu_pod(), ()),
    # ...unless the profile leaves them to an extender.
    (NodeResourcesFit(ignored_resources=[GPU]), node("n1"), gpu_pod(), ()),
    (NodeResourcesFit(ignored_resource_groups=["example.com"]), node("n1"), gpu_pod(), ()),
    # Native resources cannot be ignored.
    (NodeResourcesFit(ignored_resources=["cpu"]), node("n1", cpu="1"), pod(cpu="2"), ("Insufficient cpu",)),
    (NodeResourcesFit(), node("n1", **{"ephemeral-storage": "1Gi"}),
     pod(containers=[{"name": "c", "resources": {"requests": {"ephemeral-storage": "2Gi"}}}]),
     ("Insufficient ephemeral-storage",)),
    # Every shortfall is reported, in kube-scheduler's order.
    (NodeResourcesFit(), node("n1", cpu="1", memory="1Gi", pods=0),
     pod(containers=[{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "2Gi", GPU: "1"}}}]),
     ("Too many pods", "Insufficient cpu", "Insufficient memory", "Insufficient example.com/gpu")),
])
def test_filter(plugin, n, p, reasons):
    st = filter_nodes(plugin, p, Snapshot.build([n]))["n1"]
    assert st.reasons == reasons
    assert st.code is (Code.SUCCESS if not reasons else Code.UNSCHEDULABLE)


# ------------------------------------------------------------------- scoring
TWO_NODES = [node("node1", cpu="4000m", memory="10000"), node("node2", cpu="6000m", memory="10000")]
REQUEST = pod(containers=[container(cpu="3000m", memory="5000")])


def strategy(kind: str, **extra: Any) -> NodeResourcesFit:
    return NodeResourcesFit(scoring_strategy={"type": kind, **extra})


@pytest.mark.parametrize(("plugin", "bound", "want"), [
    # kube-scheduler's "nothing scheduled, resources requested, differently sized nodes".
    (NodeResourcesFit(), [], {"node1": 37, "node2": 50}),  # LeastAllocated is the default
    (strategy("MostAllocated"), [], {"node1": 62, "node2": 50}),
    # RequestedToCapacityRatio shaped like MostAllocated, but its average rounds: 62.5 -> 63.
    (strategy("RequestedToCapacityRatio", requestedToCapacityRatio={
        "shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]}), [],
     {"node1": 63, "node2": 50}),
    # ...and shaped like LeastAllocated.
    (strategy("RequestedToCapacityRatio", requestedToCapacityRatio={
        "shape": [{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}]}), [],
     {"node1": 38, "node2": 50}),
    # Weights: cpu counts three times as much as memory.
    (strategy("LeastAllocated", resources=[{"name": "cpu", "weight": 3}, {"name": "memory", "weight": 1}]), [],
     {"node1": (25 * 3 + 50) // 4, "node2": 50}),
    # Bound pods count: node2 cpu 4000/6000 used -> 33, memory 7500/10000 -> 25.
    (NodeResourcesFit(), [pod("x", "1000m", "2500", node_name="node2")], {"node1": 37, "node2": 29}),
    # A pod without requests counts as 100m / 200Mi: cpu 3100/4000 -> 77, and
    # 200Mi overflows this tiny node's memory, which counts as full -> 100.
    (strategy("MostAllocated"), [pod("x", node_name="node1")], {"node1": 88, "node2": 50}),
])
def test_scoring_strategies(plugin, bound, want):
    assert score_nodes(plugin, REQUEST, Snapshot.build(TWO_NODES, bound)) == want


def test_extended_resource_scored_only_when_requested():
    plugin = strategy("MostAllocated", resources=[{"name": "cpu", "weight": 1}, {"name": GPU, "weight": 1}])
    gpu_node = node("gpu", cpu="4", **{GPU: "4"})
    plain = node("plain", cpu="4")
    snap = Snapshot.build([gpu_node, plain])
    # A cpu-only pod: the GPU does not dilute the GPU node's score.
    assert score_nodes(plugin, pod(cpu="2"), snap) == {"gpu": 50, "plain": 50}
    # A GPU pod: 2 of 4 GPUs used scores 50 on that resource too.
    p = pod(containers=[{"name": "c", "resources": {"requests": {"cpu": "2", GPU: "2"}}}])
    assert score_nodes(plugin, p, snap) == {"gpu": 50, "plain": 50}


@pytest.mark.parametrize(("requested", "allocatable", "score"), [
    ({"cpu": 2000, "memory": 1000}, {"cpu": 4000, "memory": 4000}, 37),  # (50 + 25) // 2
    ({"cpu": 5000, "memory": 0}, {"cpu": 4000, "memory": 4000}, 50),  # over-committed counts as full
    ({"cpu": 0, "memory": 0}, {}, 0),
])
def test_most_allocated(requested, allocatable, score):
    assert most_allocated(requested, allocatable) == score


@pytest.mark.parametrize(("shape", "p", "want"), [
    ([(0, 0), (100, 100)], 30, 30),
    ([(0, 100), (100, 0)], 30, 70),
    ([(20, 100), (50, 0)], 10, 100),  # flat before the first point
    ([(20, 100), (50, 0)], 60, 0),  # and after the last
    ([(0, 100), (30, 0)], 20, 34),  # 100 + (-100 * 20) / 30 truncates toward zero, as Go
])
def test_broken_linear(shape, p, want):
    assert broken_linear(shape, p) == want


def test_requested_to_capacity_ratio_drops_zero_scores_from_the_average():
    shape = parse_shape([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}])
    # memory unused scores 0 and leaves the average: only cpu's 50 remains.
    assert requested_to_capacity_ratio(shape, {"cpu": 2000, "memory": 0}, {"cpu": 4000, "memory": 8000}) == 50


@pytest.mark.parametrize("args", [
    {"scoringStrategy": {"type": "Nope"}},
    {"scoringStrategy": {"type": "RequestedToCapacityRatio"}},  # shape required
    {"scoringStrategy": {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {
        "shape": [{"utilization": 50, "score": 1}, {"utilization": 40, "score": 2}]}}},
    {"scoringStrategy": {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {
        "shape": [{"utilization": 50, "score": 11}]}}},
    {"scoringStrategy": {"resources": [{"name": "cpu", "weight": 0}]}},
    {"scoringStrategy": {"resources": [{"name": "cpu"}, {"name": "cpu"}]}},
    {"bogus": 1},
])
def test_bad_args_are_refused(args):
    with pytest.raises(ValueError):
        NodeResourcesFit.from_args(args)


# --------------------------------------------------------- balanced allocation
@pytest.mark.parametrize(("bound", "p", "want"), [
    # kube-scheduler's "nothing scheduled, resources requested, differently sized nodes":
    # node1 cpu 0.75 / memory 0.5 -> std 0.125; node2 0.5 / 0.5 -> balanced.
    ([], REQUEST, {"node1": 87, "node2": 100}),
    # Real requests, not the non-zero defaults: a bound BestEffort pod changes nothing.
    ([pod("x", node_name="node1")], REQUEST, {"node1": 87, "node2": 100}),
    ([pod("x", "1000m", node_name="node1")], REQUEST, {"node1": 75, "node2": 100}),
])
def test_balanced_allocation(bound, p, want):
    assert score_nodes(NodeResourcesBalancedAllocation(), p, Snapshot.build(TWO_NODES, bound)) == want


def test_balanced_allocation_skips_best_effort_pods():
    assert score_nodes(NodeResourcesBalancedAllocation(), pod(), Snapshot.build(TWO_NODES)) is None


@pytest.mark.parametrize(("requested", "allocatable", "want"), [
    ([1, 1], [2, 2], 100),
    ([2, 0], [2, 2], 50),
    ([3, 0], [2, 2], 50),  # fractions capped at 1
    ([1, 0, 0], [1, 1, 1], 52),  # three resources: the population standard deviation
    ([1, 5], [2, 0], 100),  # a resource without allocatable is skipped
])
def test_balanced_score(requested, allocatable, want):
    assert balanced_score(requested, allocatable) == want


def test_balanced_allocation_resources_arg():
    plugin = NodeResourcesBalancedAllocation.from_args(
        {"resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
                       {"name": GPU, "weight": 1}]})
    gpu = node("g", cpu="4", memory="4Gi", **{GPU: "4"})
    snap = Snapshot.build([gpu, node("h", cpu="4", memory="4Gi")])
    # A pod without GPUs is balanced over cpu and memory only.
    assert score_nodes(plugin, pod(cpu="2", memory="2Gi"), snap) == {"g": 100, "h": 100}
