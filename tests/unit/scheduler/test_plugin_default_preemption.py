"""DefaultPreemption against hand-built snapshots: who is evicted, where, and when not at all."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleet.scheduler.framework import FitError, Framework, Nomination, num_feasible_nodes_to_find
from fleet.scheduler.plugins import default_plugins
from fleet.scheduler.plugins.default_preemption import DefaultPreemption
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import node, pod


def prio_pod(name: str, cpu: str, priority: int, node_name: str | None = None,
             start: str = "2026-01-01T00:00:00Z", **kw: Any) -> dict[str, Any]:
    p = pod(name, cpu=cpu, node_name=node_name, priority=priority, **kw)
    if node_name:
        p["status"] = {"phase": "Running", "startTime": start}
    return p


def preempt(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
            preemptor: dict[str, Any]) -> tuple[Nomination | None, Snapshot]:
    snap = Snapshot.build(nodes, pods)
    fw = Framework([*default_plugins(), DefaultPreemption(rng=random.Random(0))])
    with pytest.raises(FitError) as e:
        fw.schedule(preemptor, snap)
    return fw.post_filter(preemptor, snap, e.value), snap


def names(n: Nomination | None) -> tuple[str, list[str]] | None:
    return None if n is None else (n.node, sorted(v["metadata"]["name"] for v in n.victims))


CASES = [
    pytest.param(
        [node("a", cpu="4"), node("b", cpu="4")],
        [prio_pod("a1", "2", 100, "a"), prio_pod("a2", "2", 100, "a"),
         prio_pod("b1", "2", 10, "b"), prio_pod("b2", "2", 100, "b")],
        prio_pod("hi", "2", 1000), ("b", ["b1"]),
        id="lowest-highest-victim-priority-wins"),
    pytest.param(
        [node("a", cpu="4"), node("b", cpu="4")],
        [prio_pod("a1", "1", 0, "a"), prio_pod("a2", "1", 0, "a"), prio_pod("a3", "2", 5, "a"),
         prio_pod("b1", "2", 0, "b"), prio_pod("b2", "2", 5, "b")],
        prio_pod("hi", "2", 1000), ("b", ["b1"]),
        id="fewer-victims-at-equal-priorities"),
    pytest.param(
        [node("a", cpu="4")],
        [prio_pod("keep", "2", 50, "a"), prio_pod("go", "2", 1, "a")],
        prio_pod("hi", "2", 100), ("a", ["go"]),
        id="higher-priority-pods-are-reprieved"),
    pytest.param(
        [node("a", cpu="4")],
        [prio_pod("x", "2", 100, "a"), prio_pod("y", "2", 100, "a")],
        prio_pod("same", "2", 100), None,
        id="equal-priority-is-never-preempted"),
    pytest.param(
        [node("a", cpu="4")],
        [prio_pod("x", "2", 0, "a"), prio_pod("y", "2", 0, "a")],
        prio_pod("hi", "8", 100), None,
        id="no-eviction-makes-it-fit"),
    pytest.param(
        [node("a", cpu="4", labels={"disk": "hdd"}), node("b", cpu="4", labels={"disk": "ssd"})],
        [prio_pod("a1", "4", 0, "a"), prio_pod("b1", "4", 50, "b")],
        prio_pod("hi", "2", 100, nodeSelector={"disk": "ssd"}), ("b", ["b1"]),
        id="unresolvable-nodes-are-skipped"),
    pytest.param(
        [node("a", cpu="4")],
        [prio_pod("x", "4", 0, "a")],
        prio_pod("polite", "2", 100, preemptionPolicy="Never"), None,
        id="preemption-policy-never"),
]


@pytest.mark.parametrize(("nodes", "pods", "preemptor", "want"), CASES)
def test_preemption(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                    preemptor: dict[str, Any], want: tuple[str, list[str]] | None) -> None:
    nomination, snap = preempt(nodes, pods, preemptor)
    assert names(nomination) == want
    # The dry run leaves the snapshot as it found it.
    again = Snapshot.build(nodes, pods)
    for n in again.nodes():
        got = snap.get(n.name)
        assert got is not None
        assert sorted(got.pods) == sorted(n.pods) and got.requested == n.requested


def test_most_recently_started_victims_break_ties() -> None:
    nodes = [node("a", cpu="2"), node("b", cpu="2")]
    pods = [prio_pod("old", "2", 0, "a", start="2026-01-01T00:00:00Z"),
            prio_pod("new", "2", 0, "b", start="2026-06-01T00:00:00Z")]
    assert names(preempt(nodes, pods, prio_pod("hi", "2", 100))[0]) == ("b", ["new"])


def test_waits_while_its_victims_terminate() -> None:
    nodes = [node("a", cpu="4")]
    going = prio_pod("going", "4", 0, "a")
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    hi = prio_pod("hi", "2", 100)
    hi["status"] = {"nominatedNodeName": "a"}
    assert preempt(nodes, [going], hi)[0] is None


def test_nominated_pod_keeps_its_room() -> None:
    """A lower-priority pod may not take the room a nominated preemptor waits for."""
    snap = Snapshot.build([node("a", cpu="4")], [prio_pod("x", "2", 0, "a")])
    fw = Framework(default_plugins())
    hi = prio_pod("hi", "2", 100)
    hi["status"] = {"nominatedNodeName": "a"}
    fw.nominate(hi, "a")
    with pytest.raises(FitError):
        fw.schedule(prio_pod("low", "2", 0), snap)
    # An equal-or-higher priority pod is not held back by it (it could preempt anyway).
    assert fw.schedule(prio_pod("higher", "2", 200), snap).node == "a"
    # The preemptor itself tries its nominated node first.
    assert fw.schedule(hi, snap).node == "a"
    fw.nominate(hi, None)
    assert fw.schedule(prio_pod("low", "2", 0), snap).node == "a"


@pytest.mark.parametrize(("nodes", "pct", "want"), [
    (1, 0, 1), (99, 0, 99), (100, 0, 100), (500, 0, 230), (1000, 0, 420),
    (5000, 0, 500), (10000, 0, 500), (5000, 100, 5000), (5000, 1, 100),
])
def test_num_feasible_nodes_to_find(nodes: int, pct: int, want: int) -> None:
    assert num_feasible_nodes_to_find(nodes, pct) == want


def test_search_stops_early_and_rotates() -> None:
    nodes = [node(f"n{i:03}") for i in range(300)]
    fw = Framework(default_plugins(), percentage_of_nodes_to_score=0)
    snap = Snapshot.build(nodes)
    want = num_feasible_nodes_to_find(300)
    r1 = fw.schedule(pod("p1"), snap)
    r2 = fw.schedule(pod("p2"), snap)
    assert r1.feasible_nodes == want and r1.evaluated_nodes == want
    assert r2.evaluated_nodes == want
    assert fw._next_start == (2 * want) % 300
