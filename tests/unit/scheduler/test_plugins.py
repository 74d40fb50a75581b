"""Table-driven tests per plugin, against hand-built snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.plugins import (
    NodeAffinity,
    NodeName,
    NodeResourcesFit,
    NodeUnschedulable,
    TaintToleration,
)
from fleet.scheduler.plugins.node_resources_fit import least_allocated
from fleet.scheduler.snapshot import NodeInfo, Snapshot
from tests.unit.scheduler.factories import node, pod

UNRESOLVABLE = Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def run_filter(plugin: Any, p: dict[str, Any], n: NodeInfo) -> Status:
    state = CycleState()
    if hasattr(plugin, "pre_filter"):
        st = plugin.pre_filter(state, p)
        if st.code is Code.SKIP:
            return Status.success()
        assert st.ok, st
    return plugin.filter(state, p, n)


def info(n: dict[str, Any], *bound: dict[str, Any]) -> NodeInfo:
    snap = Snapshot.build([n], bound)
    out = snap.get(n["metadata"]["name"])
    assert out is not None
    return out


# --------------------------------------------------------------------- NodeName
@pytest.mark.parametrize(("node_name", "want"), [
    (None, Code.SUCCESS),
    ("n1", Code.SUCCESS),
    ("other", UNRESOLVABLE),
])
def test_node_name(node_name, want):
    st = run_filter(NodeName(), pod(node_name=node_name), info(node("n1")))
    assert st.code is want
    if want is not Code.SUCCESS:
        assert st.reasons == ("node(s) didn't match the requested node name",)


# ------------------------------------------------------------ NodeUnschedulable
@pytest.mark.parametrize(("cordoned", "tolerations", "want"), [
    (False, None, Code.SUCCESS),
    (True, None, UNRESOLVABLE),
    (True, [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
     Code.SUCCESS),
    (True, [{"operator": "Exists"}], Code.SUCCESS),  # tolerates everything
    (True, [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}],
     UNRESOLVABLE),
])
def test_node_unschedulable(cordoned, tolerations, want):
    p = pod(tolerations=tolerations) if tolerations else pod()
    st = run_filter(NodeUnschedulable(), p, info(node("n1", unschedulable=cordoned)))
    assert st.code is want
    if want is not Code.SUCCESS:
        assert st.reasons == ("node(s) were unschedulable",)


# -------------------------------------------------------------- TaintToleration
GPU = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
SOFT = {"key": "soft", "value": "x", "effect": "PreferNoSchedule"}
EVICT = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}


@pytest.mark.parametrize(("taints", "tolerations", "want_reason"), [
    ([], [], None),
    ([SOFT], [], None),  # PreferNoSchedule only steers scoring
    ([GPU], [], "node(s) had untolerated taint {gpu: true}"),
    ([GPU], [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}], None),
    ([GPU], [{"key": "gpu", "value": "true"}], None),  # operator defaults to Equal, any effect
    ([GPU], [{"key": "gpu", "value": "false"}], "node(s) had untolerated taint {gpu: true}"),
    ([GPU], [{"key": "gpu", "operator": "Exists"}], None),
    ([GPU], [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}],
     "node(s) had untolerated taint {gpu: true}"),
    ([GPU, EVICT], [{"key": "gpu", "operator": "Exists"}],
     "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"),
    ([GPU, EVICT], [{"operator": "Exists"}], None),
])
def test_taint_toleration(taints, tolerations, want_reason):
    st = run_filter(TaintToleration(), pod(tolerations=tolerations), info(node("n1", taints=taints)))
    if want_reason is None:
        assert st.ok
    else:
        assert st.code is UNRESOLVABLE and st.reasons == (want_reason,)


# ------------------------------------------------------------------ NodeAffinity
def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


LABELS = {"disk": "ssd", "zone": "a", "cores": "8"}


@pytest.mark.parametrize(("spec", "fits"), [
    ({}, True),
    ({"nodeSelector": {"disk": "ssd"}}, True),
    ({"nodeSelector": {"disk": "ssd", "zone": "a"}}, True),
    ({"nodeSelector": {"disk": "hdd"}}, False),
    ({"nodeSelector": {"gpu": "yes"}}, False),
    ({"affinity": required({"matchExpressions": [expr("zone", "In", "a", "b")]})}, True),
    ({"affinity": required({"matchExpressions": [expr("zone", "NotIn", "a")]})}, False),
    ({"affinity": required({"matchExpressions": [expr("gpu", "NotIn", "x")]})}, True),
    ({"affinity": required({"matchExpressions": [expr("disk", "Exists")]})}, True),
    ({"affinity": required({"matchExpressions": [expr("disk", "DoesNotExist")]})}, False),
    ({"affinity": required({"matchExpressions": [expr("cores", "Gt", "4")]})}, True),
    ({"affinity": required({"matchExpressions": [expr("cores", "Lt", "4")]})}, False),
    ({"affinity": required({"matchExpressions": [expr("zone", "Gt", "4")]})}, False),  # not a number
    # Terms are ORed...
    ({"affinity": required({"matchExpressions": [expr("zone", "In", "b")]},
                           {"matchExpressions": [expr("disk", "In", "ssd")]})}, True),
    # ...expressions inside a term ANDed.
    ({"affinity": required({"matchExpressions": [expr("zone", "In", "a"), expr("disk", "In", "hdd")]})}, False),
    ({"affinity": required({"matchFields": [expr("metadata.name", "In", "n1")]})}, True),
    ({"affinity": required({"matchFields": [expr("metadata.name", "In", "n2")]})}, False),
    ({"affinity": required({})}, False),  # an empty term matches nothing
    # nodeSelector and affinity must both hold.
    ({"nodeSelector": {"disk": "hdd"}, "affinity": required({"matchExpressions": [expr("zone", "In", "a")]})},
     False),
])
def test_node_affinity(spec, fits):
    st = run_filter(NodeAffinity(), pod(**spec), info(node("n1", labels=LABELS)))
    if fits:
        assert st.ok
    else:
        assert st.code is UNRESOLVABLE
        assert st.reasons == ("node(s) didn't match Pod's node affinity/selector",)


def test_node_affinity_skips_pods_without_constraints():
    assert NodeAffinity().pre_filter(CycleState(), pod()).code is Code.SKIP


# ------------------------------------------------------------- NodeResourcesFit
@pytest.mark.parametrize(("n", "bound", "p", "reasons"), [
    (node("n1", cpu="2", memory="4Gi"), [], pod(cpu="1", memory="1Gi"), ()),
    (node("n1", cpu="2"), [], pod(cpu="2"), ()),  # exactly full is a fit
    (node("n1", cpu="2"), [], pod(cpu="2001m"), ("Insufficient cpu",)),
    (node("n1", cpu="2"), [pod("a", "1500m", node_name="n1")], pod(cpu="600m"), ("Insufficient cpu",)),
    # Terminated pods hold nothing.
    (node("n1", cpu="2"), [pod("a", "1500m", node_name="n1", phase="Succeeded")], pod(cpu="600m"), ()),
    (node("n1", cpu="1", memory="1Gi"), [], pod(cpu="2", memory="2Gi"),
     ("Insufficient cpu", "Insufficient memory")),
    (node("n1", pods=1), [pod("a", node_name="n1")], pod(), ("Too many pods",)),
    (node("n1", pods=None), [], pod(), ("Too many pods",)),
    (node("n1"), [], pod(containers=[{"name": "c", "resources": {"requests": {"example.com/gpu": "1"}}}]),
     ("Insufficient example.com/gpu",)),
    (node("n1", **{"example.com/gpu": "2"}), [],
     pod(containers=[{"name": "c", "resources": {"requests": {"example.com/gpu": "1"}}}]), ()),
    # A pod without requests fits anywhere there is room for a pod.
    (node("n1", cpu="0", memory="0"), [], pod(), ()),
])
def test_node_resources_fit_filter(n, bound, p, reasons):
    st = run_filter(NodeResourcesFit(), p, info(n, *bound))
    assert st.reasons == reasons
    assert st.code is (Code.SUCCESS if not reasons else Code.UNSCHEDULABLE)


@pytest.mark.parametrize(("requested", "allocatable", "score"), [
    ({"cpu": 0, "memory": 0}, {"cpu": 4000, "memory": 4000}, 100),
    ({"cpu": 2000, "memory": 1000}, {"cpu": 4000, "memory": 4000}, 62),  # (50 + 75) // 2
    ({"cpu": 4000, "memory": 4000}, {"cpu": 4000, "memory": 4000}, 0),
    ({"cpu": 5000, "memory": 0}, {"cpu": 4000, "memory": 4000}, 50),  # over-committed cpu scores 0
    ({"cpu": 0, "memory": 0}, {}, 0),
])
def test_least_allocated(requested, allocatable, score):
    assert least_allocated(requested, allocatable) == score


def test_node_resources_fit_prefers_emptier_nodes():
    plugin = NodeResourcesFit()
    snap = Snapshot.build([node("busy", cpu="4"), node("idle", cpu="4")],
                          [pod("x", "3", "4Gi", node_name="busy")])
    p = pod(cpu="500m", memory="1Gi")
    state = CycleState()
    plugin.pre_score(state, p, snap.nodes())
    scores = {n.name: plugin.score(state, p, n) for n in snap.nodes()}
    assert scores["idle"] > scores["busy"]
