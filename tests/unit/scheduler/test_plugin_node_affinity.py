"""NodeAffinity: matchFields, malformed terms, preferred scoring, scheduler-enforced affinity.

(nodeSelector and required matchExpressions are covered in test_plugins.py.)
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.scheduler.framework import Code
from fleet.scheduler.plugins import NodeAffinity
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import feasible, filter_nodes, node, pod, score_nodes


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def preferred(*weighted: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": w, "preference": t} for w, t in weighted]}}


NODES = [node("n1", labels={"foo": "bar"}), node("n2", labels={"key": "value"}),
         node("n3", labels={"foo": "bar", "key": "value"})]


@pytest.mark.parametrize(("affinity", "want"), [
    # matchFields pins by name (how DaemonSet pods target their node).
    (required({"matchFields": [expr("metadata.name", "In", "n2")]}), {"n2"}),
    (required({"matchFields": [expr("metadata.name", "NotIn", "n2")]}), {"n1", "n3"}),
    # Field selectors only know In/NotIn with one value; anything else matches nothing.
    (required({"matchFields": [expr("metadata.name", "In", "n1", "n2")]}), set()),
    (required({"matchFields": [expr("metadata.name", "Exists")]}), set()),
    # An unknown field reads as "".
    (required({"matchFields": [expr("metadata.uid", "NotIn", "x")]}), {"n1", "n2", "n3"}),
    # Fields and labels in one term are ANDed; terms are ORed.
    (required({"matchFields": [expr("metadata.name", "In", "n3")], "matchExpressions": [expr("foo", "Exists")]}),
     {"n3"}),
    (required({"matchFields": [expr("metadata.name", "In", "n1")]},
              {"matchExpressions": [expr("key", "In", "value")]}), {"n1", "n2", "n3"}),
    # A malformed term matches nothing, but does not spoil the others.
    (required({"matchExpressions": [expr("foo", "Bogus", "x")]},
              {"matchExpressions": [expr("key", "Exists")]}), {"n2", "n3"}),
    (required({"matchExpressions": [expr("foo", "In")]}), set()),  # In without values
    (required({"matchExpressions": [expr("foo", "Exists", "bar")]}), set()),  # Exists with values
    # Required present but without terms: nothing matches.
    (required(), set()),
])
def test_required_terms(affinity, want):
    assert feasible(NodeAffinity(), pod(affinity=affinity), Snapshot.build(NODES)) == want


@pytest.mark.parametrize(("affinity", "want"), [
    # Each node earns the weights of the terms it matches; the best scores 100.
    (preferred((2, {"matchExpressions": [expr("foo", "In", "bar")]}),
               (4, {"matchExpressions": [expr("key", "In", "value")]})),
     {"n1": 33, "n2": 66, "n3": 100}),
    # matchFields works in preferences too.
    (preferred((5, {"matchFields": [expr("metadata.name", "In", "n1")]})), {"n1": 100, "n2": 0, "n3": 0}),
    # Nothing matches anywhere: everyone 0.
    (preferred((5, {"matchExpressions": [expr("gpu", "Exists")]})), {"n1": 0, "n2": 0, "n3": 0}),
])
def test_preferred_scoring(affinity, want):
    assert score_nodes(NodeAffinity(), pod(affinity=affinity), Snapshot.build(NODES)) == want


@pytest.mark.parametrize("affinity", [
    None,
    required({"matchExpressions": [expr("foo", "Exists")]}),  # required only
    preferred((0, {"matchExpressions": [expr("foo", "Exists")]})),  # weight 0 counts for nothing
    preferred((3, {})),  # an empty preference matches nothing
])
def test_scoring_skipped_without_preferences(affinity):
    p = pod(affinity=affinity) if affinity else pod()
    assert score_nodes(NodeAffinity(), p, Snapshot.build(NODES)) is None


def test_scheduler_enforced_affinity():
    plugin = NodeAffinity.from_args({"addedAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expr("foo", "Exists")]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [expr("key", "Exists")]}}]}})
    snap = Snapshot.build(NODES)
    statuses = filter_nodes(plugin, pod(), snap)  # applies to pods without affinity of their own
    assert {n for n, st in statuses.items() if st.ok} == {"n1", "n3"}
    assert statuses["n2"].code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert statuses["n2"].reasons == ("node(s) didn't match scheduler-enforced node affinity",)
    assert score_nodes(plugin, pod(), snap) == {"n1": 0, "n2": 100, "n3": 100}
    with pytest.raises(ValueError):
        NodeAffinity.from_args({"bogus": {}})
