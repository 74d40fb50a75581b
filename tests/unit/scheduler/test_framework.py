"""The pipeline: filters, scoring, selection and the FailedScheduling message."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleet.scheduler.framework import (
    Code,
    CycleState,
    Diagnosis,
    FitError,
    Framework,
    Status,
    fit_error_message,
)
from fleet.scheduler.plugins import default_plugins
from fleet.scheduler.snapshot import NodeInfo, Snapshot
from tests.unit.scheduler.factories import node, pod

NO_MATCH = "node(s) didn't match Pod's node affinity/selector"


def framework() -> Framework:
    return Framework(default_plugins(), rng=random.Random(7))


@pytest.mark.parametrize(("nodes", "bound", "p", "want"), [
    # Only the node with room.
    ([node("small", cpu="1"), node("big", cpu="8")], [], pod(cpu="2"), {"big"}),
    # Emptier node wins (LeastAllocated).
    ([node("a", cpu="4"), node("b", cpu="4")], [pod("x", "2", node_name="a")], pod(cpu="1"), {"b"}),
    # Selector narrows, even to a fuller node.
    ([node("a", cpu="4", labels={"disk": "ssd"}), node("b", cpu="4")],
     [pod("x", "2", node_name="a")], pod(cpu="1", nodeSelector={"disk": "ssd"}), {"a"}),
    # Cordoned and tainted nodes are skipped.
    ([node("cordoned", unschedulable=True), node("tainted", taints=[{"key": "k", "effect": "NoSchedule"}]),
      node("ok")], [], pod(), {"ok"}),
    # Equal nodes: any of them.
    ([node("a"), node("b")], [], pod(cpu="1"), {"a", "b"}),
])
def test_schedule_picks(nodes, bound, p, want):
    result = framework().schedule(p, Snapshot.build(nodes, bound))
    assert result.node in want


@pytest.mark.parametrize(("nodes", "bound", "p", "message"), [
    ([], [], pod(), "0/0 nodes are available."),
    ([node("a", cpu="1"), node("b", cpu="1"), node("c", cpu="8")], [],
     pod(cpu="2", nodeSelector={"disk": "ssd"}),
     f"0/3 nodes are available: 3 {NO_MATCH}."),
    ([node("a", cpu="1", labels={"disk": "ssd"}), node("b", cpu="1", labels={"disk": "ssd"}),
      node("c", cpu="8")], [],
     pod(cpu="2", nodeSelector={"disk": "ssd"}),
     f"0/3 nodes are available: 1 {NO_MATCH}, 2 Insufficient cpu."),
    # One node short of both cpu and memory counts under each reason.
    ([node("a", cpu="1", memory="1Gi"), node("b", cpu="1", memory="64Gi")], [],
     pod(cpu="2", memory="2Gi"),
     "0/2 nodes are available: 1 Insufficient memory, 2 Insufficient cpu."),
    ([node("a", unschedulable=True), node("b", pods=1), node("c", taints=[{"key": "gpu", "value": "1",
                                                                         "effect": "NoSchedule"}])],
     [pod("x", node_name="b")], pod(),
     "0/3 nodes are available: 1 Too many pods, 1 node(s) had untolerated taint {gpu: 1}, "
     "1 node(s) were unschedulable."),
])
def test_fit_error_messages(nodes, bound, p, message):
    with pytest.raises(FitError) as exc:
        framework().schedule(p, Snapshot.build(nodes, bound))
    assert str(exc.value) == message


def test_fit_error_message_counts_a_reason_once_per_node():
    d = Diagnosis({"a": Status.unschedulable("x", "x", "y"), "b": Status.unschedulable("x")})
    assert fit_error_message(2, d) == "0/2 nodes are available: 1 y, 2 x."


def test_unresolvable_only_when_every_node_is():
    fw = framework()
    snap = Snapshot.build([node("a", cpu="1", labels={"disk": "ssd"}), node("b")])
    with pytest.raises(FitError) as exc:
        fw.schedule(pod(nodeSelector={"disk": "hdd"}), snap)
    assert exc.value.unresolvable
    with pytest.raises(FitError) as exc:
        fw.schedule(pod(cpu="2", nodeSelector={"disk": "ssd"}), snap)
    assert not exc.value.unresolvable


class Recorder:
    """A plugin with every extension point that records the calls it gets."""

    def __init__(self, name: str, calls: list[str], *, reject: set[str] = frozenset(),  # type: ignore[assignment]
                 scores: dict[str, int] | None = None, pre_filter_code: Code = Code.SUCCESS) -> None:
        self.name = name
        self.calls = calls
        self.reject = reject
        self.scores = scores or {}
        self.pre_filter_code = pre_filter_code

    def pre_filter(self, state: CycleState, p: dict[str, Any]) -> Status:
        self.calls.append(f"{self.name}.pre_filter")
        if self.pre_filter_code is Code.UNSCHEDULABLE:
            return Status.unschedulable("pod rejected up front")
        return Status(self.pre_filter_code)

    def filter(self, state: CycleState, p: dict[str, Any], n: NodeInfo) -> Status:
        self.calls.append(f"{self.name}.filter({n.name})")
        return Status.unschedulable(f"{self.name} says no") if n.name in self.reject else Status.success()

    def score(self, state: CycleState, p: dict[str, Any], n: NodeInfo) -> int:
        self.calls.append(f"{self.name}.score({n.name})")
        return self.scores.get(n.name, 0)


def test_filters_stop_at_first_failure_per_node():
    calls: list[str] = []
    fw = Framework([Recorder("first", calls, reject={"a"}), Recorder("second", calls)])
    with pytest.raises(FitError):
        fw.schedule(pod(), Snapshot.build([node("a")]))
    assert calls == ["first.pre_filter", "second.pre_filter", "first.filter(a)"]


def test_pre_filter_skip_disables_that_plugins_filter():
    calls: list[str] = []
    fw = Framework([Recorder("skipper", calls, reject={"a"}, pre_filter_code=Code.SKIP)])
    assert fw.schedule(pod(), Snapshot.build([node("a")])).node == "a"
    assert "skipper.filter(a)" not in calls


def test_pre_filter_rejection_names_the_reason_once():
    fw = Framework([Recorder("gate", [], pre_filter_code=Code.UNSCHEDULABLE)])
    with pytest.raises(FitError) as exc:
        fw.schedule(pod(), Snapshot.build([node("a"), node("b")]))
    assert str(exc.value) == "0/2 nodes are available: pod rejected up front."


def test_weighted_scores_decide_and_single_feasible_node_is_not_scored():
    calls: list[str] = []
    a = Recorder("a", calls, scores={"n1": 100, "n2": 0})
    b = Recorder("b", calls, scores={"n1": 0, "n2": 60})
    snap = Snapshot.build([node("n1"), node("n2")])
    assert Framework([a, b]).schedule(pod(), snap).node == "n1"
    assert Framework([a, b], weights={"b": 2}).schedule(pod(), snap).node == "n2"
    calls.clear()
    Framework([Recorder("only", calls, reject={"n2"}, scores={"n1": 5})]).schedule(pod(), snap)
    assert not [c for c in calls if ".score(" in c]


def test_out_of_range_score_is_a_bug():
    fw = Framework([Recorder("bad", [], scores={"n1": 101})])
    with pytest.raises(ValueError):
        fw.schedule(pod(), Snapshot.build([node("n1"), node("n2")]))


def test_duplicate_plugin_names_are_refused():
    with pytest.raises(ValueError):
        Framework([Recorder("x", []), Recorder("x", [])])


def test_ties_are_broken_at_random():
    snap = Snapshot.build([node("a"), node("b"), node("c")])
    fw = Framework(default_plugins(), rng=random.Random(1))
    picked = {fw.schedule(pod(cpu="1"), snap).node for _ in range(50)}
    assert picked == {"a", "b", "c"}
