"""TaintToleration: hard effects filter, PreferNoSchedule scores (reverse-normalized).

Cases follow kube-scheduler's taint_toleration_test.go and the kubernetes.io
"Taints and Tolerations" page.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.scheduler.framework import Code
from fleet.scheduler.plugins import TaintToleration
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import filter_nodes, node, pod, score_nodes


def taint(key: str, value: str, effect: str) -> dict[str, Any]:
    return {"key": key, "value": value, "effect": effect}


def toleration(key: str, value: str | None = None, effect: str | None = None,
               operator: str = "Equal") -> dict[str, Any]:
    t: dict[str, Any] = {"key": key, "operator": operator}
    if value is not None:
        t["value"] = value
    if effect is not None:
        t["effect"] = effect
    return t


def test_docs_example_every_hard_taint_needs_a_toleration():
    """kubernetes.io: node1 tainted key1=value1:NoSchedule, key1=value1:NoExecute, key2=value2:NoSchedule."""
    n = node("node1", taints=[taint("key1", "value1", "NoSchedule"), taint("key1", "value1", "NoExecute"),
                              taint("key2", "value2", "NoSchedule")])
    p = pod(tolerations=[toleration("key1", "value1", "NoSchedule"), toleration("key1", "value1", "NoExecute")])
    st = filter_nodes(TaintToleration(), p, Snapshot.build([n]))["node1"]
    assert st.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert st.reasons == ("node(s) had untolerated taint {key2: value2}",)
    p["spec"]["tolerations"].append(toleration("key2", operator="Exists"))
    assert filter_nodes(TaintToleration(), p, Snapshot.build([n]))["node1"].ok


@pytest.mark.parametrize(("taints", "tolerations", "ok"), [
    ([taint("dedicated", "gpu", "NoExecute")], [], False),  # NoExecute is as hard as NoSchedule
    ([taint("dedicated", "gpu", "NoExecute")], [toleration("dedicated", "gpu", "NoExecute")], True),
    ([taint("dedicated", "gpu", "NoExecute")], [toleration("dedicated", "gpu", "NoSchedule")], False),
    ([taint("dedicated", "gpu", "PreferNoSchedule")], [], True),
    # A toleration without effect tolerates every effect of that key/value.
    ([taint("dedicated", "gpu", "NoExecute")], [toleration("dedicated", "gpu")], True),
    # Unknown operator tolerates nothing.
    ([taint("dedicated", "gpu", "NoSchedule")], [toleration("dedicated", "gpu", operator="Lt")], False),
])
def test_hard_effects(taints, tolerations, ok):
    st = filter_nodes(TaintToleration(), pod(tolerations=tolerations), Snapshot.build([node("n", taints=taints)]))
    assert st["n"].ok is ok


@pytest.mark.parametrize(("tolerations", "node_taints", "want"), [
    # A node whose PreferNoSchedule taints are tolerated beats one whose aren't.
    ([toleration("foo", "bar", "PreferNoSchedule")],
     {"nodeA": [taint("foo", "bar", "PreferNoSchedule")], "nodeB": [taint("foo", "blah", "PreferNoSchedule")]},
     {"nodeA": 100, "nodeB": 0}),
    # All tolerated: all equal.
    ([toleration("foo", "bar", "PreferNoSchedule"), toleration("cpu-type", "arm64", "PreferNoSchedule")],
     {"nodeA": [], "nodeB": [taint("foo", "bar", "PreferNoSchedule")],
      "nodeC": [taint("foo", "bar", "PreferNoSchedule"), taint("cpu-type", "arm64", "PreferNoSchedule")]},
     {"nodeA": 100, "nodeB": 100, "nodeC": 100}),
    # The more intolerable taints, the lower the score.
    ([toleration("foo", "bar", "PreferNoSchedule")],
     {"nodeA": [], "nodeB": [taint("cpu-type", "arm64", "PreferNoSchedule")],
      "nodeC": [taint("cpu-type", "arm64", "PreferNoSchedule"), taint("gpu", "none", "PreferNoSchedule")]},
     {"nodeA": 100, "nodeB": 50, "nodeC": 0}),
    # Only PreferNoSchedule taints count, and only tolerations that can cover them.
    ([toleration("cpu-type", "arm64", "NoSchedule")],
     {"nodeA": [taint("cpu-type", "arm64", "NoSchedule")], "nodeB": [taint("cpu-type", "arm64", "PreferNoSchedule")],
      "nodeC": [taint("cpu-type", "arm64", "PreferNoSchedule"), taint("gpu", "none", "PreferNoSchedule")]},
     {"nodeA": 100, "nodeB": 50, "nodeC": 0}),
    # An effect-less toleration covers PreferNoSchedule too.
    ([toleration("gpu", operator="Exists")],
     {"nodeA": [taint("gpu", "none", "PreferNoSchedule")], "nodeB": [taint("cpu", "x", "PreferNoSchedule")]},
     {"nodeA": 100, "nodeB": 0}),
])
def test_prefer_no_schedule_scoring(tolerations, node_taints, want):
    snap = Snapshot.build([node(name, taints=ts) for name, ts in node_taints.items()])
    assert score_nodes(TaintToleration(), pod(tolerations=tolerations), snap) == want


def test_scoring_skipped_when_no_node_has_soft_taints():
    snap = Snapshot.build([node("a", taints=[taint("k", "v", "NoSchedule")]), node("b")])
    assert score_nodes(TaintToleration(), pod(), snap) is None
    # The snapshot notices a taint appearing (and going).
    snap.set_node(node("b", taints=[taint("k", "v", "PreferNoSchedule")]))
    assert score_nodes(TaintToleration(), pod(), snap) == {"a": 100, "b": 0}
    snap.set_node(node("b"))
    assert score_nodes(TaintToleration(), pod(), snap) is None
