"""PodTopologySpread: the kubernetes.io examples, minDomains, node inclusion policies, scoring, defaults.

The clusters are those of the "Pod Topology Spread Constraints" page (label
keys `zone` and `node`, as there).  Filter cases run with the snapshot on
the CycleState and without it (the plugin then finds it through the nodes).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from fleet.scheduler.framework import Code, CycleState, FitError, Framework
from fleet.scheduler.plugins import PodTopologySpread, default_plugins, default_weights
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import (
    HOSTNAME,
    ZONE,
    filter_nodes,
    node,
    pod,
    score_nodes,
    spread,
)

REASON = "node(s) didn't match pod topology spread constraints"
MISSING = REASON + " (missing required label)"
FOO = {"foo": "bar"}


@pytest.fixture(params=[True, False], ids=["state-snapshot", "deferred"])
def attach(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def docs_node(name: str, zone: str, **labels: str) -> dict[str, Any]:
    return node(name, labels={"zone": zone, "node": name, **labels})


def foo_on(*node_names: str, labels: dict[str, str] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return [pod(f"p{i}", node_name=n, labels=labels or FOO, **kw) for i, n in enumerate(node_names)]


def mypod(*constraints: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return pod("mypod", labels=FOO if labels is None else labels,
               topologySpreadConstraints=list(constraints), **spec)


FOUR_NODES = [docs_node("node1", "zoneA"), docs_node("node2", "zoneA"),
              docs_node("node3", "zoneB"), docs_node("node4", "zoneB")]
EXAMPLE_PODS = foo_on("node1", "node2", "node3")


def passing(p: dict[str, Any], snap: Snapshot, attach: bool = True) -> set[str]:
    return {n for n, st in filter_nodes(PodTopologySpread(), p, snap, attach=attach).items() if st.ok}


@pytest.mark.parametrize(("p", "want"), [
    # One constraint, maxSkew 1: zoneA has 2, zoneB 1 -> only zoneB.
    (mypod(spread(1, "zone", FOO)), {"node3", "node4"}),
    # maxSkew 2 lets it into zoneA as well.
    (mypod(spread(2, "zone", FOO)), {"node1", "node2", "node3", "node4"}),
    # topologyKey node: only the empty node4.
    (mypod(spread(1, "node", FOO)), {"node4"}),
    # Two constraints: zone and node -> node4.
    (mypod(spread(1, "zone", FOO), spread(1, "node", FOO)), {"node4"}),
    # ScheduleAnyway never filters.
    (mypod(spread(1, "zone", FOO, when="ScheduleAnyway")), {"node1", "node2", "node3", "node4"}),
    # A pod that does not match its own selector does not add to its domain's count.
    (mypod(spread(1, "zone", FOO), labels={}), {"node1", "node2", "node3", "node4"}),
])
def test_docs_examples(p, want, attach):
    assert passing(p, Snapshot.build(FOUR_NODES, EXAMPLE_PODS), attach) == want


def test_docs_conflicting_constraints():
    """3 nodes, zoneA {node1: 2, node2: 1}, zoneB {node3: 2}: zone says B, node says node2 -> Pending."""
    nodes = [docs_node("node1", "zoneA"), docs_node("node2", "zoneA"), docs_node("node3", "zoneB")]
    snap = Snapshot.build(nodes, foo_on("node1", "node1", "node2", "node3", "node3"))
    p = mypod(spread(1, "zone", FOO), spread(1, "node", FOO))
    assert passing(p, snap) == set()
    fw = Framework(default_plugins(), weights=default_weights())
    with pytest.raises(FitError) as exc:
        fw.schedule(p, snap)
    assert str(exc.value) == f"0/3 nodes are available: 3 {REASON}."
    assert not exc.value.unresolvable  # a pod leaving could fix it


def test_docs_node_affinity_excludes_zone_c(attach):
    """5 nodes over zones A-C; the pod's node affinity rules out zoneC, so zoneC's emptiness does not count."""
    nodes = FOUR_NODES + [docs_node("node5", "zoneC")]
    snap = Snapshot.build(nodes, EXAMPLE_PODS)
    not_c = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["zoneC"]}]}]}}}
    # Honor (default): domains A=2, B=1 -> zoneB.
    assert passing(mypod(spread(1, "zone", FOO), affinity=not_c), snap, attach) == {"node3", "node4", "node5"}
    fw = Framework(default_plugins(), weights=default_weights())
    assert fw.schedule(mypod(spread(1, "zone", FOO), affinity=not_c), snap).node in {"node3", "node4"}
    # nodeSelector is honoured the same way.
    sel = mypod(spread(1, "zone", FOO), nodeSelector={"node": "node1"})
    assert passing(sel, snap, attach) >= {"node1"}  # alone in its domain set, node1's zone is the minimum
    # Ignore: zoneC (0 pods) is the global minimum; only zoneC fits the spread, which affinity forbids.
    ignore = mypod(spread(1, "zone", FOO, nodeAffinityPolicy="Ignore"), affinity=not_c)
    assert passing(ignore, snap, attach) == {"node5"}
    with pytest.raises(FitError):
        fw.schedule(ignore, snap)


def test_missing_topology_label_is_unresolvable(attach):
    snap = Snapshot.build(FOUR_NODES + [node("typo", labels={"zone-typo": "zoneC"})], EXAMPLE_PODS)
    statuses = filter_nodes(PodTopologySpread(), mypod(spread(1, "zone", FOO)), snap, attach=attach)
    assert statuses["typo"].code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert statuses["typo"].reasons == (MISSING,)
    assert statuses["node1"].reasons == (REASON,) and statuses["node1"].code is Code.UNSCHEDULABLE
    assert {n for n, st in statuses.items() if st.ok} == {"node3", "node4"}


def test_pods_on_nodes_without_the_key_do_not_count(attach):
    """kubernetes.io: if node1 had no zone label, its pods would be disregarded."""
    nodes = [node("node1", labels={"node": "node1"})] + FOUR_NODES[1:]
    snap = Snapshot.build(nodes, foo_on("node1", "node1", "node2", "node3", "node3"))
    # zoneA now counts 1 (node2), zoneB 2: zoneA is where it goes.
    assert passing(mypod(spread(1, "zone", FOO)), snap, attach) == {"node2"}


@pytest.mark.parametrize(("min_domains", "want"), [
    (None, {"node1", "node2", "node3", "node4"}),  # A=1, B=1: skew after placing is 1
    (2, {"node1", "node2", "node3", "node4"}),
    # Fewer eligible domains than minDomains: the global minimum counts as 0, so
    # each zone already at 1 would become 2 > maxSkew.
    (3, set()),
])
def test_min_domains(min_domains, want, attach):
    extra = {} if min_domains is None else {"minDomains": min_domains}
    snap = Snapshot.build(FOUR_NODES, foo_on("node1", "node3"))
    assert passing(mypod(spread(1, "zone", FOO, **extra)), snap, attach) == want


def test_node_taints_policy(attach):
    tainted = docs_node("node5", "zoneC")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    snap = Snapshot.build(FOUR_NODES + [tainted], EXAMPLE_PODS)
    # Ignore (default): the tainted, empty zoneC is the minimum (0): zoneB at 1 is already at the limit.
    assert passing(mypod(spread(1, "zone", FOO)), snap, attach) == {"node5"}
    # Honor: zoneC is not eligible; zoneB is the minimum again.
    honor = mypod(spread(1, "zone", FOO, nodeTaintsPolicy="Honor"))
    assert passing(honor, snap, attach) == {"node3", "node4", "node5"}


def test_match_label_keys(attach):
    # Old revision pods pile up in zoneA; the new revision spreads on its own.
    bound = foo_on("node1", "node2", labels={"foo": "bar", "rev": "old"})
    snap = Snapshot.build(FOUR_NODES, bound)
    plain = mypod(spread(1, "zone", FOO), labels={"foo": "bar", "rev": "new"})
    keyed = mypod(spread(1, "zone", FOO, matchLabelKeys=["rev"]), labels={"foo": "bar", "rev": "new"})
    assert passing(plain, snap, attach) == {"node3", "node4"}
    assert passing(keyed, snap, attach) == {"node1", "node2", "node3", "node4"}


def test_only_same_namespace_and_live_pods_count(attach):
    bound = (foo_on("node1", "node2", namespace="other")
             + [pod("dying", node_name="node1", labels=FOO, deleting=True)])
    snap = Snapshot.build(FOUR_NODES, bound)
    assert passing(mypod(spread(1, "zone", FOO)), snap, attach) == {"node1", "node2", "node3", "node4"}


def test_counts_follow_pod_and_node_changes():
    snap = Snapshot.build(FOUR_NODES, EXAMPLE_PODS)
    p = mypod(spread(1, "zone", FOO))
    assert passing(p, snap) == {"node3", "node4"}
    snap.set_pod(pod("p9", node_name="node4", labels=FOO))  # zoneB catches up: 2 / 2
    assert passing(p, snap) == {"node1", "node2", "node3", "node4"}
    snap.set_node(docs_node("node4", "zoneA"))  # relabelled: zoneA 3, zoneB 1
    assert passing(p, snap) == {"node3"}
    snap.remove_pod("default/p2")  # the pod on node3: zoneB has 0
    assert passing(p, snap) == {"node3"}
    snap.remove_node("node3")  # no zoneB any more: zoneA is the only domain
    assert passing(p, snap) == {"node1", "node2", "node4"}


def test_bad_constraint_is_an_error():
    st = PodTopologySpread().pre_filter(CycleState(), mypod({"topologyKey": "zone", "maxSkew": 0}))
    assert st.code is Code.ERROR


def test_preemption_extensions_update_counts():
    snap = Snapshot.build(FOUR_NODES, EXAMPLE_PODS)
    plugin = PodTopologySpread()
    p = mypod(spread(1, "zone", FOO))
    state = CycleState()
    state.snapshot = snap  # type: ignore[attr-defined]
    assert plugin.pre_filter(state, p).ok
    node1 = snap.get("node1")
    assert node1 is not None
    assert not plugin.filter(state, p, node1).ok
    plugin.remove_pod(state, p, EXAMPLE_PODS[0], node1)  # zoneA 1, zoneB 1
    assert plugin.filter(state, p, node1).ok
    plugin.add_pod(state, p, EXAMPLE_PODS[0], node1)
    assert not plugin.filter(state, p, node1).ok
    assert passing(p, snap) == {"node3", "node4"}  # the snapshot is untouched


# ------------------------------------------------------------------- scoring
def test_schedule_anyway_prefers_the_emptier_domain():
    snap = Snapshot.build(FOUR_NODES, EXAMPLE_PODS)
    # weight log(2 domains + 2); zoneA raw round(2 * 1.386) = 3, zoneB round(1.386) = 1;
    # normalized 100 * (max + min - raw) / max.
    scores = score_nodes(PodTopologySpread(), mypod(spread(1, "zone", FOO, when="ScheduleAnyway")), snap)
    assert scores == {"node1": 33, "node2": 33, "node3": 100, "node4": 100}
    raw = score_nodes(PodTopologySpread(), mypod(spread(1, "zone", FOO, when="ScheduleAnyway")), snap,
                      normalize=False)
    assert raw == {"node1": round(2 * math.log(4)), "node2": 3, "node3": 1, "node4": 1}


def test_scoring_hostname_and_max_skew():
    snap = Snapshot.build(FOUR_NODES, EXAMPLE_PODS)
    p = mypod(spread(3, "node", FOO, when="ScheduleAnyway"))
    # log(4 nodes + 2) per pod, plus maxSkew - 1 = 2 everywhere.
    raw = score_nodes(PodTopologySpread(), p, snap, normalize=False)
    assert raw == {"node1": round(math.log(6) + 2), "node2": 4, "node3": 4, "node4": 2}
    assert score_nodes(PodTopologySpread(), p, snap) == {"node1": 50, "node2": 50, "node3": 50, "node4": 100}


def test_scoring_ignores_nodes_missing_a_key():
    snap = Snapshot.build(FOUR_NODES + [node("bare")], EXAMPLE_PODS)
    scores = score_nodes(PodTopologySpread(), mypod(spread(1, "zone", FOO, when="ScheduleAnyway")), snap)
    assert scores is not None and scores["bare"] == 0 and scores["node3"] == 100


# --------------------------------------------------------- cluster defaults
ZONED = [node("a1", zone="a"), node("a2", zone="a"), node("b1", zone="b"), node("b2", zone="b")]
WEB = {"app": "web", "pod-template-hash": "5d8"}


def web_pods(*nodes: str) -> list[dict[str, Any]]:
    return [pod(f"web-{i}", node_name=n, labels=WEB, owner="ReplicaSet") for i, n in enumerate(nodes)]


def test_system_defaults_spread_controlled_pods():
    snap = Snapshot.build(ZONED, web_pods("a1", "a1", "a2", "b1"))
    scores = score_nodes(PodTopologySpread(), pod("web-new", labels=WEB, owner="ReplicaSet"), snap)
    assert scores is not None
    assert scores["b2"] == 100 and scores["b2"] > scores["a2"] > scores["a1"]
    # No hard constraints come from the defaults.
    assert PodTopologySpread().pre_filter(CycleState(), pod("w", labels=WEB, owner="ReplicaSet")).code is Code.SKIP


@pytest.mark.parametrize("p", [
    pod("bare", labels=WEB),  # not controlled
    pod("job", labels=WEB, owner="Job"),  # not a kind whose selector kube-scheduler uses
    pod("nolabels", owner="ReplicaSet"),
    pod("own", labels=WEB, owner="ReplicaSet", topologySpreadConstraints=[spread(1, ZONE, WEB)]),  # own win
])
def test_defaults_do_not_apply(p):
    snap = Snapshot.build(ZONED, web_pods("a1"))
    assert score_nodes(PodTopologySpread(), p, snap) is None


def test_defaults_ignore_per_pod_controller_labels():
    ss = {"app": "db", "statefulset.kubernetes.io/pod-name": "db-0", "controller-revision-hash": "db-7f"}
    bound = [pod("db-0", node_name="a1", labels=ss, owner="StatefulSet")]
    snap = Snapshot.build(ZONED, bound)
    new = pod("db-1", owner="StatefulSet", labels={**ss, "statefulset.kubernetes.io/pod-name": "db-1"})
    scores = score_nodes(PodTopologySpread(), new, snap)
    assert scores is not None and scores["a1"] < scores["b1"]


def test_system_defaults_still_spread_by_hostname_without_zones():
    snap = Snapshot.build([node("h1"), node("h2")], web_pods("h1"))
    # hostname maxSkew 3 dampens: raw h1 round(log(4) + 2) = 3, h2 2 -> 100 * (3 + 2 - raw) / 3.
    assert score_nodes(PodTopologySpread(), pod("w", labels=WEB, owner="ReplicaSet"), snap) == {"h1": 66, "h2": 100}


def test_list_defaults():
    plugin = PodTopologySpread.from_args({"defaultingType": "List", "defaultConstraints": [
        {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]})
    snap = Snapshot.build(ZONED, web_pods("a1", "a2"))
    assert passing_with(plugin, pod("w", labels=WEB, owner="ReplicaSet"), snap) == {"b1", "b2"}
    # List with no constraints disables defaulting.
    off = PodTopologySpread.from_args({"defaultingType": "List", "defaultConstraints": []})
    assert score_nodes(off, pod("w", labels=WEB, owner="ReplicaSet"), snap) is None
    for bad in ({"defaultingType": "System", "defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE}]},
                {"defaultingType": "List", "defaultConstraints": [
                    {"maxSkew": 1, "topologyKey": ZONE, "labelSelector": {}}]},
                {"defaultingType": "Sometimes"}):
        with pytest.raises(ValueError):
            PodTopologySpread.from_args(bad)


def passing_with(plugin: Any, p: dict[str, Any], snap: Snapshot) -> set[str]:
    return {n for n, st in filter_nodes(plugin, p, snap).items() if st.ok}


def test_thirty_replicas_land_within_max_skew():
    """A 30-replica workload over 3 zones with maxSkew 1 through the whole default profile."""
    nodes = [node(f"n{i:02d}", zone=f"zone-{i % 3}") for i in range(20)]
    snap = Snapshot.build(nodes)
    fw = Framework(default_plugins(), weights=default_weights(), rng=random.Random(5))
    labels = {"app": "spread"}
    for i in range(30):
        p = pod(f"r{i}", "100m", labels=labels, owner="ReplicaSet",
                topologySpreadConstraints=[spread(1, ZONE, labels), spread(1, HOSTNAME, labels)])
        p["spec"]["nodeName"] = fw.schedule(p, snap).node
        snap.set_pod(p)
        per_zone = [sum(len(n.pods) for n in snap.nodes() if n.labels[ZONE] == z) for z in ("zone-0", "zone-1",
                                                                                            "zone-2")]
        assert max(per_zone) - min(per_zone) <= 1
    per_node = [len(n.pods) for n in snap.nodes()]
    assert max(per_node) - min(per_node) <= 1
