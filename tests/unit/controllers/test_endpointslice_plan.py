"""The EndpointSlice controller's pure decision (`plan_slices`): endpoints from pods,
ports per pod, labels, packing with minimal churn, the placeholder slice; and the
algebra under hypothesis — slices never exceed the maximum, every wanted endpoint is
in exactly one slice, and planning again after applying a plan changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.controllers.endpoints_util import LABEL_HEADLESS, LAST_CHANGE_TRIGGER_TIME
from fleet.controllers.endpointslice_plan import (
    endpoint_ports,
    plan_slices,
    pod_to_endpoint,
    slice_labels,
)
from tests.unit.controllers.endpoints_fixtures import (
    NODES,
    NS,
    SVC_UID,
    FakeSlices,
    node,
    pod,
    service,
)


def run(svc: dict[str, Any], pods: list[dict[str, Any]], store: FakeSlices | None = None, *, max_n: int = 100,
        nodes: dict[str, Any] | None = None, trigger: str | None = None) -> FakeSlices:
    store = store or FakeSlices()
    plan = plan_slices(svc, pods, NODES if nodes is None else nodes, store.list(), max_per_slice=max_n,
                       trigger_time=trigger)
    store.apply(plan)
    return store


# ---------------------------------------------------------------------------------------
# One endpoint


@pytest.mark.parametrize("ready,deleting,publish,want", [
    (True, False, False, {"ready": True, "serving": True, "terminating": False}),
    (False, False, False, {"ready": False, "serving": False, "terminating": False}),
    (True, True, False, {"ready": False, "serving": True, "terminating": True}),
    (False, True, False, {"ready": False, "serving": False, "terminating": True}),
    (False, False, True, {"ready": True, "serving": False, "terminating": False}),
    (True, True, True, {"ready": True, "serving": True, "terminating": True}),
])
def test_endpoint_conditions(ready: bool, deleting: bool, publish: bool, want: dict[str, bool]) -> None:
    ep = pod_to_endpoint(pod("a", ready=ready, deleting=deleting), NODES["n1"], service(publish=publish), "IPv4")
    assert ep["conditions"] == want


def test_endpoint_fields() -> None:
    ep = pod_to_endpoint(pod("a", "10.42.0.7", hostname="a", subdomain="web"), NODES["n1"], service(), "IPv4")
    assert ep == {"addresses": ["10.42.0.7"], "conditions": {"ready": True, "serving": True, "terminating": False},
                  "targetRef": {"kind": "Pod", "namespace": NS, "name": "a", "uid": "uid-a"},
                  "nodeName": "n1", "zone": "zone-a", "hostname": "a"}
    # hostname only when the subdomain is this Service; no zone label, no zone
    ep = pod_to_endpoint(pod("a", hostname="a", subdomain="other"), node("n1", None), service(), "IPv4")
    assert "hostname" not in ep and "zone" not in ep


@pytest.mark.parametrize("service_ports,container_ports,want", [
    ([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}], [],
     [{"name": "http", "port": 8080, "protocol": "TCP"}]),
    ([{"port": 80, "protocol": "TCP"}], [], [{"name": "", "port": 80, "protocol": "TCP"}]),
    ([{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}],
     [{"name": "web", "containerPort": 9000, "protocol": "TCP"}], [{"name": "http", "port": 9000, "protocol": "TCP"}]),
    # named port of another protocol: no match, port left out
    ([{"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"}],
     [{"name": "dns", "containerPort": 5353, "protocol": "TCP"}], []),
    ([{"name": "h", "port": 80, "targetPort": "nope", "protocol": "TCP"},
      {"name": "m", "port": 9090, "targetPort": 9090, "protocol": "TCP", "appProtocol": "http"}], [],
     [{"name": "m", "port": 9090, "protocol": "TCP", "appProtocol": "http"}]),
])
def test_endpoint_ports(service_ports: list[dict[str, Any]], container_ports: list[dict[str, Any]],
                        want: list[dict[str, Any]]) -> None:
    assert endpoint_ports(service(ports=service_ports), pod("a", ports=container_ports)) == want


# ---------------------------------------------------------------------------------------
# Which pods


def test_which_pods() -> None:
    pods = [pod("ok", "10.42.0.1"), pod("noip", None), pod("done", "10.42.0.3", phase="Succeeded"),
            pod("failed", "10.42.0.4", phase="Failed"), pod("other", "10.42.0.5", labels={"app": "db"}),
            pod("otherns", "10.42.0.6", ns="elsewhere"), pod("term", "10.42.0.7", deleting=True),
            pod("notready", "10.42.0.8", ready=False)]
    store = run(service(), pods)
    assert store.addresses() == ["10.42.0.1", "10.42.0.7", "10.42.0.8"]


def test_pod_on_unknown_node_waits_unless_publishing() -> None:
    pods = [pod("a", "10.42.0.1"), pod("b", "10.42.0.2", node="ghost")]
    plan = plan_slices(service(), pods, NODES, [])
    assert plan.skipped_pods == ["b"]
    assert [e["addresses"] for e in plan.create[0]["endpoints"]] == [["10.42.0.1"]]
    plan = plan_slices(service(publish=True), pods, NODES, [])
    assert plan.skipped_pods == [] and len(plan.create[0]["endpoints"]) == 2


# ---------------------------------------------------------------------------------------
# Slices: shape, labels, ports


def test_new_slice_shape() -> None:
    svc = service(labels={"team": "a", "kubernetes.io/service-name": "spoof"})
    store = run(svc, [pod("a", "10.42.0.1")], trigger="2026-01-01T00:01:00Z")
    [s] = store.list()
    md = s["metadata"]
    assert md["name"].startswith("web-") and md["namespace"] == NS
    assert md["labels"] == {"team": "a", "kubernetes.io/service-name": "web",
                            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
    assert md["ownerReferences"] == [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": SVC_UID,
                                      "controller": True, "blockOwnerDeletion": True}]
    assert md["annotations"] == {LAST_CHANGE_TRIGGER_TIME: "2026-01-01T00:01:00Z"}
    assert s["addressType"] == "IPv4"
    assert s["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]


@pytest.mark.parametrize("cluster_ip,headless", [("None", True), (None, True), ("", True), ("10.43.0.9", False)])
def test_headless_label(cluster_ip: str | None, headless: bool) -> None:
    assert (LABEL_HEADLESS in slice_labels(service(cluster_ip=cluster_ip))) == headless


def test_pods_resolving_ports_differently_go_to_different_slices() -> None:
    svc = service(ports=[{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}])
    pods = [pod("a", "10.42.0.1", ports=[{"name": "web", "containerPort": 8080}]),
            pod("b", "10.42.0.2", ports=[{"name": "web", "containerPort": 9090}]),
            pod("c", "10.42.0.3", ports=[{"name": "web", "containerPort": 8080}])]
    store = run(svc, pods)
    got = sorted((s["ports"][0]["port"], sorted(e["addresses"][0] for e in s["endpoints"])) for s in store.list())
    assert got == [(8080, ["10.42.0.1", "10.42.0.3"]), (9090, ["10.42.0.2"])]


def test_headless_without_ports() -> None:
    store = run(service(cluster_ip="None", ports=[]), [pod("a", "10.42.0.1")])
    [s] = store.list()
    assert s["ports"] == [] and s["endpoints"][0]["addresses"] == ["10.42.0.1"]
    assert LABEL_HEADLESS in s["metadata"]["labels"]


def test_ipv6_service_takes_ipv6_addresses() -> None:
    p = pod("a", "10.42.0.1")
    p["status"]["podIPs"].append({"ip": "fd00::1"})
    store = run(service(cluster_ip="fd00:43::10"), [p])
    [s] = store.list()
    assert s["addressType"] == "IPv6" and s["endpoints"][0]["addresses"] == ["fd00::1"]


# ---------------------------------------------------------------------------------------
# Churn


def test_no_pods_one_placeholder_kept() -> None:
    store = run(service(), [])
    [s] = store.list()
    assert s["endpoints"] == [] and s["ports"] == []
    writes = store.writes
    run(service(), [], store)
    assert store.writes == writes  # not deleted and created again


def test_placeholder_becomes_the_first_slice_in_place() -> None:
    store = run(service(), [])
    [placeholder] = store.list()
    run(service(), [pod("a", "10.42.0.1")], store)
    [s] = store.list()
    assert s["metadata"]["name"] == placeholder["metadata"]["name"]  # recycled: an update
    assert s["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]


def test_last_pod_gone_leaves_the_placeholder() -> None:
    store = run(service(), [pod("a", "10.42.0.1")])
    run(service(), [], store)
    [s] = store.list()
    assert s["endpoints"] == []


def test_one_pod_more_is_one_update() -> None:
    pods = [pod(f"p{i}", f"10.42.0.{i}") for i in range(1, 4)]
    store = run(service(), pods)
    writes = store.writes
    plan = plan_slices(service(), pods + [pod("p9", "10.42.0.9")], NODES, store.list())
    assert (len(plan.create), len(plan.update), len(plan.delete)) == (0, 1, 0)
    store.apply(plan)
    assert store.writes == writes + 1 and len(store.addresses()) == 4


def test_readiness_change_updates_in_place() -> None:
    store = run(service(), [pod("a", "10.42.0.1"), pod("b", "10.42.0.2")])
    plan = plan_slices(service(), [pod("a", "10.42.0.1"), pod("b", "10.42.0.2", ready=False)], NODES, store.list())
    assert (len(plan.create), len(plan.update), len(plan.delete)) == (0, 1, 0)
    ep = next(e for e in plan.update[0]["endpoints"] if e["targetRef"]["name"] == "b")
    assert ep["conditions"] == {"ready": False, "serving": False, "terminating": False}


def test_nothing_changed_nothing_written() -> None:
    pods = [pod(f"p{i}", f"10.42.0.{i}") for i in range(1, 8)]
    store = run(service(), pods, max_n=3)
    assert plan_slices(service(), pods, NODES, store.list(), max_per_slice=3).empty


def test_service_label_change_updates_labels_only() -> None:
    store = run(service(), [pod("a", "10.42.0.1")])
    plan = plan_slices(service(labels={"tier": "front"}), [pod("a", "10.42.0.1")], NODES, store.list())
    assert len(plan.update) == 1 and not plan.create and not plan.delete
    assert plan.update[0]["metadata"]["labels"]["tier"] == "front"


def test_slices_of_another_incarnation_or_type_are_deleted() -> None:
    store = run(service(uid="old-uid"), [pod("a", "10.42.0.1")])
    [old] = store.list()
    plan = plan_slices(service(), [pod("a", "10.42.0.1")], NODES, store.list())
    assert [d["metadata"]["name"] for d in plan.delete] == [old["metadata"]["name"]]
    assert len(plan.create) == 1  # not recycled: it is not ours


def test_terminating_service_creates_nothing() -> None:
    svc = service()
    svc["metadata"]["deletionTimestamp"] = "2026-01-01T00:09:00Z"
    assert plan_slices(svc, [pod("a", "10.42.0.1")], NODES, []).create == []


def test_new_endpoints_fill_the_tightest_unchanged_slice() -> None:
    svc = service()
    pods = [pod(f"p{i:02d}", f"10.42.0.{i}") for i in range(1, 8)]  # 7 pods, slices of 4: 4 + 3
    store = run(svc, pods, max_n=4)
    assert sorted(len(s["endpoints"]) for s in store.list()) == [3, 4]
    plan = plan_slices(svc, pods + [pod("p99", "10.42.0.99")], NODES, store.list(), max_per_slice=4)
    assert not plan.create and len(plan.update) == 1 and len(plan.update[0]["endpoints"]) == 4


def test_trigger_time_absent_clears_annotation() -> None:
    store = run(service(), [pod("a", "10.42.0.1")], trigger="2026-01-01T00:01:00Z")
    plan = plan_slices(service(), [pod("a", "10.42.0.1", ready=False)], NODES, store.list())
    assert "annotations" not in plan.update[0]["metadata"]


# ---------------------------------------------------------------------------------------
# The algebra


pod_sets = st.sets(st.integers(min_value=1, max_value=60), max_size=45)


def _pods(ids: set[int], not_ready: set[int] = frozenset()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    return [pod(f"p{i:03d}", f"10.42.1.{i}", ready=i not in not_ready, node="n1" if i % 2 else "n2")
            for i in sorted(ids)]


def _check(store: FakeSlices, pods: list[dict[str, Any]], max_n: int) -> None:
    slices = store.list()
    for s in slices:
        assert len(s["endpoints"]) <= max_n
    addrs = [a for s in slices for e in s["endpoints"] for a in e["addresses"]]
    assert sorted(addrs) == sorted(p["status"]["podIP"] for p in pods)  # each exactly once
    if pods:
        assert all(s["endpoints"] for s in slices)  # no empty slice beside real ones
    else:
        assert len(slices) == 1 and slices[0]["endpoints"] == []
    # the fewest slices possible is not promised, but never more than one partly
    # empty slice per reason to have one: bounded by wanted/max + slices kept
    for s in slices:
        for e in s["endpoints"]:
            p = next(p for p in pods if p["status"]["podIP"] == e["addresses"][0])
            assert e["conditions"]["ready"] == any(c["status"] == "True" for c in p["status"]["conditions"])


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(pod_sets, st.sets(st.integers(1, 60))), min_size=1, max_size=5),
       max_n=st.integers(min_value=1, max_value=12))
def test_packing_covers_every_endpoint_once_and_never_exceeds_the_max(
        steps: list[tuple[set[int], set[int]]], max_n: int) -> None:
    store = FakeSlices()
    svc = service()
    for ids, not_ready in steps:
        pods = _pods(ids, not_ready)
        store.apply(plan_slices(svc, pods, NODES, store.list(), max_per_slice=max_n))
        _check(store, pods, max_n)
        # a second pass has nothing to do
        assert plan_slices(svc, pods, NODES, store.list(), max_per_slice=max_n).empty


@settings(max_examples=100, deadline=None)
@given(ids=pod_sets, extra=st.integers(min_value=61, max_value=80), max_n=st.integers(min_value=1, max_value=12))
def test_one_more_endpoint_costs_at_most_one_write(ids: set[int], extra: int, max_n: int) -> None:
    store = FakeSlices()
    svc = service()
    pods = _pods(ids)
    store.apply(plan_slices(svc, pods, NODES, store.list(), max_per_slice=max_n))
    before = store.writes
    pods.append(pod(f"p{extra:03d}", f"10.42.1.{extra}", node="n1"))
    store.apply(plan_slices(svc, pods, NODES, store.list(), max_per_slice=max_n))
    assert store.writes - before == 1
    _check(store, pods, max_n)


@settings(max_examples=100, deadline=None)
@given(ids=pod_sets.filter(bool), max_n=st.integers(min_value=1, max_value=12), data=st.data())
def test_removing_endpoints_never_creates(ids: set[int], max_n: int, data: st.DataObject) -> None:
    store = FakeSlices()
    svc = service()
    store.apply(plan_slices(svc, _pods(ids), NODES, [], max_per_slice=max_n))
    keep = data.draw(st.sets(st.sampled_from(sorted(ids))))
    plan = plan_slices(svc, _pods(keep), NODES, store.list(), max_per_slice=max_n)
    assert not plan.create or (not keep and len(plan.create) == 1 and not plan.update)
    store.apply(plan)
    _check(store, _pods(keep), max_n)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), max_n=st.integers(min_value=1, max_value=10))
def test_any_starting_slices_converge_in_one_plan(data: st.DataObject, max_n: int) -> None:
    """Whatever slices exist — stale endpoints, duplicates across slices, endpoints with
    old conditions, empty slices, other labels — one plan leaves every wanted endpoint
    in exactly one slice, none over the maximum, and a second plan has nothing to do."""
    svc = service()
    wanted = data.draw(pod_sets, label="wanted")
    stale = data.draw(st.sets(st.integers(61, 90), max_size=15), label="stale")
    not_ready = data.draw(st.sets(st.integers(1, 60)), label="not ready")
    pods = _pods(wanted, not_ready)
    # endpoints as they might be stored: the wanted ones (some with old conditions) and stale ones
    stored_eps = [pod_to_endpoint(p, NODES[p["spec"]["nodeName"]], svc, "IPv4") for p in _pods(wanted | stale)]
    flip = data.draw(st.sets(st.integers(0, max(0, len(stored_eps) - 1))), label="flipped")
    for i in flip:
        if i < len(stored_eps):
            stored_eps[i]["conditions"] = {"ready": False, "serving": False, "terminating": True}
    dup = data.draw(st.lists(st.sampled_from(stored_eps), max_size=5), label="duplicates") if stored_eps else []
    pool = data.draw(st.permutations(stored_eps + dup), label="order")
    store = FakeSlices()
    template = plan_slices(svc, [], NODES, []).create[0]  # a placeholder: the shape of an empty slice
    i = 0
    while i < len(pool) or not store.items:
        size = data.draw(st.integers(0, max_n), label="slice size")
        body = {**template, "metadata": dict(template["metadata"]),
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": pool[i:i + size]}
        if data.draw(st.booleans(), label="other labels"):
            body["metadata"]["labels"] = {**body["metadata"]["labels"], "old": "label"}
        store.apply(type(plan_slices(svc, [], NODES, []))(create=[body]))
        i += size
    store.apply(plan_slices(svc, pods, NODES, store.list(), max_per_slice=max_n))
    _check(store, pods, max_n)
    assert plan_slices(svc, pods, NODES, store.list(), max_per_slice=max_n).empty
