"""The DaemonSet plan: which nodes fit, one pod per node, rolling updates, status (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio

from fleet.controllers.daemonset import slow_start
from fleet.controllers.daemonset_plan import (
    HASH_LABEL,
    add_daemon_tolerations,
    daemon_pod,
    daemon_spec,
    node_should_run,
    plan_daemonset,
    scaled,
    target_node,
)

NOW = 2_000_000.0
H1, H2 = "hash1", "hash2"


def make_ds(*, node_selector: dict[str, str] | None = None, tolerations: list[dict[str, Any]] | None = None,
            strategy: str = "RollingUpdate", max_unavailable: Any = 1, max_surge: Any = 0,
            affinity: dict[str, Any] | None = None, host_network: bool = False,
            min_ready: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "img"}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    if affinity:
        spec["affinity"] = affinity
    if host_network:
        spec["hostNetwork"] = True
    us: dict[str, Any] = {"type": strategy}
    if strategy == "RollingUpdate":
        us["rollingUpdate"] = {"maxUnavailable": max_unavailable, "maxSurge": max_surge}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "ns", "uid": "ds-uid", "generation": 3},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "updateStrategy": us,
                     "minReadySeconds": min_ready,
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec}}}


def make_node(name: str, *, labels: dict[str, str] | None = None,
              taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []}}


_seq = iter(range(10_000))


def make_pod(node: str, *, hash_: str = H1, phase: str = "Running", ready: bool = True,
             terminating: bool = False, bound: bool = True, age: int = 100) -> dict[str, Any]:
    i = next(_seq)
    created = dt.datetime.fromtimestamp(NOW - age, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    md: dict[str, Any] = {"name": f"agent-{i:04d}", "namespace": "ns", "uid": f"uid-{i}",
                          "creationTimestamp": created, "labels": {"app": "agent", HASH_LABEL: hash_}}
    if terminating:
        md["deletionTimestamp"] = created
    spec: dict[str, Any] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}
    if bound:
        spec["nodeName"] = node
    return {"metadata": md, "spec": spec, "status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": created}]}}


def nodes(*names: str) -> list[dict[str, Any]]:
    return [make_node(n) for n in names]


def deleted_nodes(p: Any) -> list[str]:
    return sorted(target_node(d) or "" for d in p.delete)


# ---------------------------------------------------------------------------------------
# Which nodes


NO_SCHEDULE = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
NO_EXECUTE = {"key": "dedicated", "value": "db", "effect": "NoExecute"}
TOLERATE_DB = {"key": "dedicated", "operator": "Equal", "value": "db"}

FITS = [
    ("plain node", make_ds(), make_node("n"), (True, True)),
    ("nodeSelector matches", make_ds(node_selector={"disk": "ssd"}), make_node("n", labels={"disk": "ssd"}),
     (True, True)),
    ("nodeSelector does not", make_ds(node_selector={"disk": "ssd"}), make_node("n"), (False, False)),
    ("required affinity", make_ds(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}),
     make_node("n", labels={"zone": "b"}), (False, False)),
    ("matchFields on the node name", make_ds(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n"]}]}]}}}),
     make_node("n"), (False, False)),
    ("untolerated NoSchedule: no new pod, an existing one stays", make_ds(),
     make_node("n", taints=[NO_SCHEDULE]), (False, True)),
    ("untolerated NoExecute: none at all", make_ds(), make_node("n", taints=[NO_EXECUTE]), (False, False)),
    ("tolerated taints", make_ds(tolerations=[TOLERATE_DB]), make_node("n", taints=[NO_SCHEDULE, NO_EXECUTE]),
     (True, True)),
    ("cordoned nodes still run daemons", make_ds(),
     make_node("n", taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]), (True, True)),
    ("not-ready NoExecute is tolerated forever", make_ds(),
     make_node("n", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]), (True, True)),
    ("memory pressure is tolerated", make_ds(),
     make_node("n", taints=[{"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]), (True, True)),
    ("network-unavailable only for hostNetwork", make_ds(),
     make_node("n", taints=[{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]),
     (False, True)),
    ("network-unavailable, hostNetwork", make_ds(host_network=True),
     make_node("n", taints=[{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]),
     (True, True)),
    ("PreferNoSchedule does not matter", make_ds(),
     make_node("n", taints=[{"key": "x", "effect": "PreferNoSchedule"}]), (True, True)),
]


@pytest.mark.parametrize(("ds", "node", "want"), [r[1:] for r in FITS], ids=[r[0] for r in FITS])
def test_node_should_run(ds, node, want):
    assert node_should_run(daemon_spec(ds), node) == want


def test_template_node_name_limits_to_one_node():
    ds = make_ds()
    ds["spec"]["template"]["spec"]["nodeName"] = "a"
    assert node_should_run(daemon_spec(ds), make_node("a")) == (True, True)
    assert node_should_run(daemon_spec(ds), make_node("b")) == (False, False)


def test_default_tolerations_replace_limited_ones():
    spec: dict[str, Any] = {"tolerations": [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "mine", "operator": "Exists"}]}
    add_daemon_tolerations(spec)
    keys = [(t.get("key"), t.get("effect"), t.get("tolerationSeconds")) for t in spec["tolerations"]]
    assert keys == [("node.kubernetes.io/not-ready", "NoExecute", None), ("mine", None, None),
                    ("node.kubernetes.io/unreachable", "NoExecute", None),
                    ("node.kubernetes.io/disk-pressure", "NoSchedule", None),
                    ("node.kubernetes.io/memory-pressure", "NoSchedule", None),
                    ("node.kubernetes.io/pid-pressure", "NoSchedule", None),
                    ("node.kubernetes.io/unschedulable", "NoSchedule", None)]


def test_daemon_pod_is_pinned_by_node_affinity_not_node_name():
    ds = make_ds(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}})
    pod = daemon_pod(ds, H1, "node-7")
    assert "nodeName" not in pod["spec"]
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]}]}
    assert target_node(pod) == "node-7"
    assert pod["metadata"]["generateName"] == "agent-"
    assert pod["metadata"]["labels"] == {"app": "agent", HASH_LABEL: H1}
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert any(t["key"] == "node.kubernetes.io/unreachable" for t in pod["spec"]["tolerations"])


# ---------------------------------------------------------------------------------------
# One pod per node


def test_creates_on_every_fitting_node_and_follows_joins():
    p = plan_daemonset(make_ds(), nodes("a", "b", "c"), [], H1, NOW)
    assert p.create_on == ["a", "b", "c"] and p.delete == []
    p = plan_daemonset(make_ds(), nodes("a", "b", "c", "d"), [make_pod(n) for n in "abc"], H1, NOW)
    assert p.create_on == ["d"] and p.delete == []


def test_removes_pods_from_nodes_that_no_longer_fit():
    ds = make_ds(node_selector={"role": "edge"})
    ns = [make_node("a", labels={"role": "edge"}), make_node("b")]
    p = plan_daemonset(ds, ns, [make_pod("a"), make_pod("b")], H1, NOW)
    assert p.create_on == [] and deleted_nodes(p) == ["b"]
    assert p.status["numberMisscheduled"] == 1 and p.status["desiredNumberScheduled"] == 1


def test_tainted_node_keeps_running_pod_unless_no_execute():
    ns = [make_node("a", taints=[NO_SCHEDULE]), make_node("b", taints=[NO_EXECUTE]), make_node("c")]
    p = plan_daemonset(make_ds(), ns, [make_pod("a"), make_pod("b")], H1, NOW)
    assert p.create_on == ["c"] and deleted_nodes(p) == ["b"]


def test_extra_pods_on_a_node_keep_the_oldest():
    old, new = make_pod("a", age=500), make_pod("a", age=10)
    p = plan_daemonset(make_ds(), nodes("a"), [new, old], H1, NOW)
    assert [d["metadata"]["uid"] for d in p.delete] == [new["metadata"]["uid"]]


def test_failed_and_succeeded_pods_are_replaced():
    failed, done = make_pod("a", phase="Failed", ready=False), make_pod("b", phase="Succeeded", ready=False)
    p = plan_daemonset(make_ds(), nodes("a", "b"), [failed, done], H1, NOW)
    assert [(n, pod["metadata"]["uid"]) for n, pod in p.failed] == [("a", failed["metadata"]["uid"])]
    assert [d["metadata"]["uid"] for d in p.delete] == [done["metadata"]["uid"]]
    assert p.create_on == []  # after they are gone


def test_unscheduled_pod_for_a_vanished_node_is_deleted():
    stray = make_pod("gone", bound=False)
    bound = make_pod("gone2")  # bound pods of deleted nodes are the pod GC's
    p = plan_daemonset(make_ds(), nodes("a"), [stray, bound, make_pod("a")], H1, NOW)
    assert [d["metadata"]["uid"] for d in p.delete] == [stray["metadata"]["uid"]]


def test_waiting_for_own_writes_reports_status_only():
    p = plan_daemonset(make_ds(), nodes("a", "b"), [make_pod("a")], H1, NOW, act=False)
    assert p.create_on == [] and p.delete == [] and "observedGeneration" not in p.status
    p = plan_daemonset(make_ds(), nodes("a", "b"), [make_pod("a")], H1, NOW)
    assert p.status == {"desiredNumberScheduled": 2, "currentNumberScheduled": 1, "numberMisscheduled": 0,
                        "numberReady": 1, "updatedNumberScheduled": 1, "numberAvailable": 1,
                        "numberUnavailable": 1, "observedGeneration": 3}


# ---------------------------------------------------------------------------------------
# Rolling updates


def old_pods(*names: str, **kw: Any) -> list[dict[str, Any]]:
    return [make_pod(n, hash_=H1, **kw) for n in names]


@pytest.mark.parametrize(("max_unavailable", "deleted"), [(1, 1), (2, 2), ("34%", 2), ("100%", 4), ("10%", 1)])
def test_max_unavailable(max_unavailable, deleted):
    ds = make_ds(max_unavailable=max_unavailable)
    p = plan_daemonset(ds, nodes("a", "b", "c", "d"), old_pods("a", "b", "c", "d"), H2, NOW)
    assert len(p.delete) == deleted and p.create_on == []


def test_rolling_counts_unavailable_new_pods():
    ds = make_ds(max_unavailable=1)
    pods = [make_pod("a", hash_=H2, ready=False), *old_pods("b", "c")]
    assert plan_daemonset(ds, nodes("a", "b", "c"), pods, H2, NOW).delete == []
    pods = [make_pod("a", hash_=H2), *old_pods("b", "c")]
    assert deleted_nodes(plan_daemonset(ds, nodes("a", "b", "c"), pods, H2, NOW)) == ["b"]


def test_rolling_replaces_unavailable_old_pods_regardless():
    ds = make_ds(max_unavailable=1)
    pods = [*old_pods("a", "b", ready=False), *old_pods("c")]
    assert deleted_nodes(plan_daemonset(ds, nodes("a", "b", "c"), pods, H2, NOW)) == ["a", "b"]


def test_on_delete_never_replaces():
    ds = make_ds(strategy="OnDelete")
    assert plan_daemonset(ds, nodes("a", "b"), old_pods("a", "b"), H2, NOW).delete == []


def test_surge_starts_new_pods_beside_old_ones():
    ds = make_ds(max_surge=1, max_unavailable=0)
    p = plan_daemonset(ds, nodes("a", "b", "c"), old_pods("a", "b", "c"), H2, NOW)
    assert p.create_on == ["a"] and p.delete == []
    # The new pod on a is not available yet: wait (the old one stays).
    pods = [*old_pods("a", "b", "c"), make_pod("a", hash_=H2, ready=False, age=5)]
    p = plan_daemonset(ds, nodes("a", "b", "c"), pods, H2, NOW)
    assert p.create_on == [] and p.delete == []
    # Available: the old pod on a goes, and b gets its new pod.
    pods = [*old_pods("a", "b", "c"), make_pod("a", hash_=H2, age=5)]
    p = plan_daemonset(ds, nodes("a", "b", "c"), pods, H2, NOW)
    assert deleted_nodes(p) == ["a"] and p.create_on == ["b"]


def test_surge_percent_and_unavailable_old_pods():
    ds = make_ds(max_surge="50%", max_unavailable=0)
    pods = [*old_pods("a", ready=False), *old_pods("b", "c", "d")]
    p = plan_daemonset(ds, nodes("a", "b", "c", "d"), pods, H2, NOW)
    assert p.create_on == ["a", "b", "c"]  # a (unavailable) always, plus 2 surge slots


@pytest.mark.parametrize(("value", "total", "want"), [
    (1, 10, 1), ("25%", 10, 3), ("0%", 10, 0), ("100%", 3, 3), ("bad", 3, 0), (True, 3, 0)])
def test_scaled_rounds_up(value, total, want):
    assert scaled(value, total) == want


async def test_slow_start_stops_after_a_failing_batch():
    seen: list[int] = []

    async def fn(i: int) -> None:
        seen.append(i)
        await trio.sleep(0)
        if i == 4:
            raise ValueError("refused")

    attempted, errors = await slow_start(list(range(20)), fn)
    assert attempted == 7 and len(errors) == 1 and sorted(seen) == list(range(7))  # batches 1, 2, 4
