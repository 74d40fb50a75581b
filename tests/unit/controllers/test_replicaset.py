"""The ReplicaSet controller's decision (`plan`), ranking, status and slow start — pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.controllers.replicaset import (
    compute_status,
    deletion_order,
    next_availability,
    plan,
    pod_available,
    pod_from_template,
    rfc3339,
    slow_start_batches,
    status_patch,
)

NOW = 1_800_000_000.0
RS_UID = "rs-uid"


def rs(replicas: int = 3, *, min_ready: int = 0, deleting: bool = False, generation: int = 2,
       status: dict[str, Any] | None = None, name: str = "web-abc") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns", "uid": RS_UID, "generation": generation}
    if deleting:
        md["deletionTimestamp"] = rfc3339(NOW)
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": md,
            "spec": {"replicas": replicas, "minReadySeconds": min_ready,
                     "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web", "tier": "fe"},
                                               "annotations": {"a": "b"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
            "status": status or {}}


def pod(name: str, *, owner: str | None = RS_UID, labels: dict[str, str] | None = None,
        node: str = "n1", phase: str = "Running", ready: bool = True, ready_ago: float = 1000,
        created_ago: float = 1000, restarts: int = 0, deleting: bool = False,
        cost: int | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                          "labels": {"app": "web", "tier": "fe"} if labels is None else labels,
                          "creationTimestamp": rfc3339(NOW - created_ago), "resourceVersion": "7"}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                                  "uid": owner, "controller": True}]
    if deleting:
        md["deletionTimestamp"] = rfc3339(NOW)
    if cost is not None:
        md["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": str(cost)}
    conds = [{"type": "Ready", "status": "True" if ready else "False",
              "lastTransitionTime": rfc3339(NOW - ready_ago)}]
    return {"metadata": md, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": conds,
                       "containerStatuses": [{"name": "c", "restartCount": restarts}]}}


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


# ---------------------------------------------------------------------------------------
# plan: counts, adoption, release, expectations


@pytest.mark.parametrize(("desc", "replicas", "pods", "kw", "want"), [
    ("nothing yet: create all", 3, [], {}, dict(create=3)),
    ("at count: nothing to do", 2, [pod("a"), pod("b")], {}, dict(create=0, delete=[])),
    ("one short", 3, [pod("a"), pod("b")], {}, dict(create=1)),
    ("one too many", 1, [pod("a", created_ago=10), pod("b", created_ago=100)], {},
     dict(delete=["a"])),
    ("terminating pods do not count (replacement starts now)", 2,
     [pod("a"), pod("b", deleting=True)], {}, dict(create=1)),
    ("finished pods do not count", 2, [pod("a"), pod("b", phase="Failed"),
                                       pod("c", phase="Succeeded")], {}, dict(create=1)),
    ("another controller's pod is not ours", 1, [pod("x", owner="other")], {}, dict(create=1)),
    ("orphan matching the selector is adopted and counted", 2, [pod("a"), pod("o", owner=None)], {},
     dict(create=0, adopt=["o"])),
    ("orphan not matching is left alone", 1, [pod("o", owner=None, labels={"app": "db"})], {},
     dict(create=1, adopt=[])),
    ("owned pod no longer matching is released, replaced", 1,
     [pod("a", labels={"app": "moved"})], {}, dict(create=1, release=["a"])),
    ("expectations pending: no create", 3, [], {"expectations_satisfied": False},
     dict(create=0)),
    ("expectations pending: no delete", 0, [pod("a")], {"expectations_satisfied": False},
     dict(delete=[])),
    ("being deleted: nothing adopted, released, created", 3,
     [pod("o", owner=None), pod("m", labels={"app": "x"})], {"deleting": True},
     dict(create=0, adopt=[], release=[])),
    ("burst caps creations", 1000, [], {"burst": 500}, dict(create=500)),
    ("burst caps deletions", 0, [pod(f"p{i}") for i in range(5)], {"burst": 2},
     dict(delete_count=2)),
    ("scale to zero deletes all", 0, [pod("a"), pod("b")], {}, dict(delete_count=2)),
])
def test_plan(desc: str, replicas: int, pods: list[dict[str, Any]], kw: dict[str, Any],
              want: dict[str, Any]) -> None:
    deleting = kw.pop("deleting", False)
    p = plan(rs(replicas, deleting=deleting), pods, now=NOW, **kw)
    if "create" in want:
        assert p.create == want["create"], desc
    if "delete" in want:
        assert names(p.delete) == want["delete"], desc
    if "delete_count" in want:
        assert len(p.delete) == want["delete_count"], desc
    if "adopt" in want:
        assert names(p.adopt) == want["adopt"], desc
    if "release" in want:
        assert names(p.release) == want["release"], desc


# ---------------------------------------------------------------------------------------
# Which pod goes first


@pytest.mark.parametrize(("desc", "first", "second"), [
    ("unscheduled before scheduled", pod("u", node="", phase="Pending", ready=False), pod("s")),
    ("pending before running", pod("p", phase="Pending", ready=False), pod("r")),
    ("unknown before running", pod("u", phase="Unknown"), pod("r")),
    ("pending before unknown", pod("p", phase="Pending", ready=False), pod("u", phase="Unknown")),
    ("not ready before ready", pod("n", ready=False), pod("r")),
    ("lower deletion cost first", pod("cheap", cost=-5), pod("dear", cost=10)),
    ("more recently ready first", pod("new", ready_ago=5), pod("old", ready_ago=5000)),
    ("more restarts first", pod("crashy", restarts=7), pod("calm", restarts=0)),
    ("newer first", pod("young", created_ago=3), pod("aged", created_ago=30000)),
    ("scheduling trumps readiness", pod("u", node="", phase="Running"), pod("n", ready=False)),
    ("readiness trumps restarts", pod("n", ready=False, restarts=0), pod("r", restarts=9)),
])
def test_deletion_order(desc: str, first: dict[str, Any], second: dict[str, Any]) -> None:
    assert names(deletion_order([second, first], now=NOW)) == names([first, second]), desc
    assert names(deletion_order([first, second], now=NOW)) == names([first, second]), desc


def test_deletion_order_prefers_crowded_nodes() -> None:
    lonely = pod("lonely", node="n1")
    crowded = pod("crowded", node="n2")
    related = [lonely, crowded, pod("x", node="n2"), pod("y", node="n2")]
    assert names(deletion_order([lonely, crowded], related, now=NOW)) == ["crowded", "lonely"]


def test_same_log_age_falls_back_to_uid_order() -> None:
    # 1000 s and 1001 s ago are the same on a log2 scale: the uid breaks the tie.
    a, b = pod("a", created_ago=1000), pod("b", created_ago=1001)
    assert names(deletion_order([b, a], now=NOW)) == ["a", "b"]


# ---------------------------------------------------------------------------------------
# Status


def test_status_counts() -> None:
    pods = [pod("a"), pod("b", ready=False), pod("c", labels={"app": "web"}),
            pod("d", ready_ago=2)]
    st = compute_status(rs(4, min_ready=10), pods, NOW)
    assert st == {"replicas": 4, "fullyLabeledReplicas": 3, "readyReplicas": 3,
                  "availableReplicas": 2, "observedGeneration": 2}


def test_status_omits_zero_counts_but_keeps_replicas() -> None:
    assert compute_status(rs(0), [], NOW) == {"replicas": 0, "observedGeneration": 2}


def test_replica_failure_condition_set_kept_and_cleared() -> None:
    st = compute_status(rs(3), [], NOW, ("FailedCreate", 'pods "x" is forbidden: exceeded quota'))
    cond = st["conditions"][0]
    assert cond["type"] == "ReplicaFailure" and cond["status"] == "True"
    assert cond["reason"] == "FailedCreate" and "exceeded quota" in cond["message"]
    # Still failing later: the first report stays (time and message).
    later = compute_status(rs(3, status=st), [], NOW + 60, ("FailedCreate", "other"))
    assert later["conditions"] == [cond]
    # A pass without failure clears it.
    assert "conditions" not in compute_status(rs(3, status=st), [], NOW + 90)


@pytest.mark.parametrize(("min_ready", "ready_ago", "available"), [
    (0, 0, True), (10, 5, False), (10, 10, False), (10, 11, True),
])
def test_pod_available(min_ready: int, ready_ago: float, available: bool) -> None:
    assert pod_available(pod("a", ready_ago=ready_ago), min_ready, NOW) is available


def test_requeue_when_a_pod_will_become_available() -> None:
    assert next_availability(rs(min_ready=0), [pod("a", ready_ago=1)], NOW) is None
    wait = next_availability(rs(min_ready=10), [pod("a", ready_ago=4), pod("b", ready_ago=8)], NOW)
    assert wait is not None and 2 <= wait <= 3
    assert next_availability(rs(min_ready=10), [pod("a", ready_ago=50)], NOW) is None
    p = plan(rs(2, min_ready=10), [pod("a", ready_ago=4), pod("b", ready_ago=8)], now=NOW)
    assert p.requeue_after is not None and p.requeue_after <= 3


def test_status_patch_is_minimal_and_deletes_dropped_keys() -> None:
    old = {"replicas": 3, "readyReplicas": 3, "observedGeneration": 1}
    assert status_patch(old, dict(old)) is None
    assert status_patch(old, {"replicas": 3, "observedGeneration": 2}) == {
        "observedGeneration": 2, "readyReplicas": None}


# ---------------------------------------------------------------------------------------
# Creation


@pytest.mark.parametrize(("count", "batches"), [
    (0, []), (1, [1]), (2, [1, 1]), (3, [1, 2]), (7, [1, 2, 4]), (10, [1, 2, 4, 3]),
    (500, [1, 2, 4, 8, 16, 32, 64, 128, 245]),
])
def test_slow_start_batches(count: int, batches: list[int]) -> None:
    assert slow_start_batches(count) == batches
    assert sum(batches) == count


def test_pod_from_template() -> None:
    body = pod_from_template(rs(name="x" * 70))
    md = body["metadata"]
    assert md["generateName"] == "x" * 58  # the API server's limit for a generateName base
    assert md["labels"] == {"app": "web", "tier": "fe"} and md["annotations"] == {"a": "b"}
    ref = md["ownerReferences"][0]
    assert ref == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x" * 70, "uid": RS_UID,
                   "controller": True, "blockOwnerDeletion": True}
    assert body["spec"]["containers"][0]["image"] == "busybox"
    assert pod_from_template(rs())["metadata"]["generateName"] == "web-abc-"
