"""Pod requests (init containers, sidecars, overhead) and the snapshot's bookkeeping."""

from __future__ import annotations

import pytest

from fleet.scheduler.podinfo import pod_requests
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import container, node, pod

MI = 1024 * 1024


@pytest.mark.parametrize(("p", "want"), [
    (pod(cpu="500m", memory="128Mi"), {"cpu": 500, "memory": 128 * MI}),
    (pod(containers=[container("a", "1"), container("b", "250m", "1Gi")]),
     {"cpu": 1250, "memory": 1024 * MI}),
    # An init container bigger than the app phase sets the pod's need...
    (pod(cpu="100m", init=[container("i", "2", "64Mi")]), {"cpu": 2000, "memory": 64 * MI}),
    # ...a smaller one does not add to it (init containers run one at a time).
    (pod(cpu="1", init=[container("i1", "500m"), container("i2", "300m")]), {"cpu": 1000}),
    # A sidecar (restartable init container) keeps running: it adds to later
    # init containers and to the app phase.
    (pod(cpu="1", init=[container("side", "200m", restartPolicy="Always"), container("i", "1500m")]),
     {"cpu": 1700}),
    (pod(cpu="1", init=[container("side", "200m", restartPolicy="Always")]), {"cpu": 1200}),
    (pod(cpu="1", overhead={"cpu": "100m"}), {"cpu": 1100}),
    (pod(), {}),
    (pod(containers=[container(**{"resources": {"requests": {"example.com/gpu": "2"}}})]),
     {"example.com/gpu": 2}),
])
def test_pod_requests(p, want):
    assert pod_requests(p) == want


def test_non_zero_requests_for_scoring():
    assert pod_requests(pod(), non_zero=True) == {"cpu": 100, "memory": 200 * MI}
    assert pod_requests(pod(cpu="1"), non_zero=True) == {"cpu": 1000, "memory": 200 * MI}


def test_snapshot_counts_bound_running_pods_only():
    snap = Snapshot.build(
        [node("a"), node("b")],
        [pod("p1", "1", node_name="a"), pod("p2", "500m", node_name="a"),
         pod("done", "2", node_name="a", phase="Succeeded"), pod("pending", "3")])
    a = snap.get("a")
    assert a is not None and a.requested == {"cpu": 1500} and set(a.pods) == {"default/p1", "default/p2"}
    assert snap.get("b").requested == {}  # type: ignore[union-attr]
    # A pod finishing frees its share; a deleted one too.
    snap.set_pod(pod("p1", "1", node_name="a", phase="Failed"))
    snap.remove_pod("default/p2")
    assert a.requested == {"cpu": 0} and not a.pods


def test_pods_seen_before_their_node_are_counted_when_it_appears():
    snap = Snapshot.build([], [pod("early", "1", node_name="late")])
    snap.set_node(node("late"))
    assert snap.get("late").requested == {"cpu": 1000}  # type: ignore[union-attr]
    snap.remove_node("late")
    snap.set_node(node("late"))  # re-registered under the same name: pods still there
    assert snap.get("late").requested == {"cpu": 1000}  # type: ignore[union-attr]


def test_node_without_allocatable_falls_back_to_capacity():
    n = node("a")
    del n["status"]["allocatable"]
    assert Snapshot.build([n]).get("a").allocatable["cpu"] == 4000  # type: ignore[union-attr]
