"""The mirroring controller's pure decision (`plan_mirror`, `should_mirror`), and the
shared helpers of the three endpoints controllers: pod → Service memberships on pod
events, the last-change trigger time, and the slice tracker's staleness rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.controllers.endpoints_plan import repack_subsets
from fleet.controllers.endpoints_util import (
    LAST_APPLIED,
    LAST_CHANGE_TRIGGER_TIME,
    SliceTracker,
    TriggerTimeTracker,
    find_port,
    services_for_pod_change,
)
from fleet.controllers.endpointslicemirroring_plan import plan_mirror, should_mirror
from tests.unit.controllers.endpoints_fixtures import NS, FakeSlices, pod, service


def endpoints(subsets: list[dict[str, Any]], *, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None, name: str = "ext") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": NS, "uid": "ep-uid", "resourceVersion": "5"}
    if labels:
        md["labels"] = labels
    if annotations:
        md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": md, "subsets": subsets}


DNS = [{"addresses": [{"ip": "10.0.0.2"}], "notReadyAddresses": [{"ip": "10.0.0.3", "hostname": "b"}],
        "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}]


def mirror(ep: dict[str, Any], store: FakeSlices | None = None, **kw: Any) -> FakeSlices:
    store = store or FakeSlices()
    store.apply(plan_mirror(ep, store.list(), **kw))
    return store


def test_mirrored_slice() -> None:
    ep = endpoints(DNS, labels={"k8s-app": "kube-dns"},
                   annotations={"a": "b", LAST_APPLIED: "{}", LAST_CHANGE_TRIGGER_TIME: "x"})
    [s] = mirror(ep).list()
    assert s["addressType"] == "IPv4"
    assert s["metadata"]["labels"] == {"k8s-app": "kube-dns", "kubernetes.io/service-name": "ext",
                                       "endpointslice.kubernetes.io/managed-by":
                                           "endpointslicemirroring-controller.k8s.io"}
    assert s["metadata"]["annotations"] == {"a": "b"}
    assert s["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Endpoints", "name": "ext",
                                                   "uid": "ep-uid", "controller": True,
                                                   "blockOwnerDeletion": True}
    assert sorted((p["port"], p["protocol"], p["name"]) for p in s["ports"]) == [(53, "TCP", "dns-tcp"),
                                                                                   (53, "UDP", "dns")]
    assert s["endpoints"] == [{"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
                              {"addresses": ["10.0.0.3"], "conditions": {"ready": False}, "hostname": "b"}]


def test_stable_then_updated_in_place() -> None:
    store = mirror(endpoints(DNS))
    assert plan_mirror(endpoints(DNS), store.list()).empty
    [before] = store.list()
    changed = [dict(DNS[0], addresses=[{"ip": "10.0.0.2"}, {"ip": "10.0.0.4"}])]
    plan = plan_mirror(endpoints(changed), store.list())
    assert not plan.create and not plan.delete and len(plan.update) == 1
    store.apply(plan)
    [after] = store.list()
    assert after["metadata"]["name"] == before["metadata"]["name"] and len(after["endpoints"]) == 3


def test_families_and_port_sets_get_their_own_slices() -> None:
    subsets = [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}], "ports": [{"port": 80, "protocol": "TCP"}]},
               {"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 81, "protocol": "TCP"}]}]
    got = sorted((s["addressType"], s["ports"][0]["port"], [e["addresses"][0] for e in s["endpoints"]])
                 for s in mirror(endpoints(subsets)).list())
    assert got == [("IPv4", 80, ["10.0.0.1"]), ("IPv4", 81, ["10.0.0.9"]), ("IPv6", 80, ["fd00::1"])]


def test_invalid_and_too_many_addresses_reported() -> None:
    subsets = [{"addresses": [{"ip": "0.0.0.0.0"}] + [{"ip": f"10.0.0.{i}"} for i in range(1, 6)],
                "ports": [{"port": 80, "protocol": "TCP"}]}]
    plan = plan_mirror(endpoints(subsets), [], max_per_subset=3)
    assert len(plan.create[0]["endpoints"]) == 3
    assert plan.invalid_addresses == 1 and plan.skipped_addresses == 3
    assert [r for r, _ in plan.events] == ["InvalidIPAddress", "TooManyAddressesToMirror"]


def test_no_subsets_deletes_and_port_change_recycles() -> None:
    store = mirror(endpoints(DNS))
    [old] = store.list()
    plan = plan_mirror(endpoints([dict(DNS[0], ports=[{"name": "x", "port": 5353, "protocol": "UDP"}])]),
                       store.list())
    assert not plan.create and not plan.delete and plan.update[0]["metadata"]["name"] == old["metadata"]["name"]
    plan = plan_mirror(endpoints([]), store.list())
    assert [d["metadata"]["name"] for d in plan.delete] == [old["metadata"]["name"]] and not plan.create


def test_duplicate_slices_for_one_key_are_reduced_to_one() -> None:
    store = mirror(endpoints(DNS))
    [s] = store.list()
    twin = dict(s, metadata=dict(s["metadata"], name="ext-twin", uid="twin", resourceVersion="1"))
    plan = plan_mirror(endpoints(DNS), [s, twin])
    assert [d["metadata"]["name"] for d in plan.delete] == ["ext-twin"] and not plan.update


@pytest.mark.parametrize("labels,annotations,want", [
    (None, None, True),
    ({"endpointslice.kubernetes.io/skip-mirror": "true"}, None, False),
    ({"endpointslice.kubernetes.io/skip-mirror": "false"}, None, True),
    (None, {"control-plane.alpha.kubernetes.io/leader": "{}"}, False),
])
def test_should_mirror(labels: dict[str, str] | None, annotations: dict[str, str] | None, want: bool) -> None:
    assert should_mirror(endpoints(DNS, labels=labels, annotations=annotations)) == want


# ---------------------------------------------------------------------------------------
# Shared helpers


def test_services_for_pod_change() -> None:
    web, db = service("web"), service("db", selector={"app": "db"})
    other = service("other", selector={"app": "web"})
    other["metadata"]["namespace"] = "elsewhere"
    svcs = [web, db, other]
    a = pod("a", "10.42.0.1")
    names = lambda ss: sorted(s["metadata"]["name"] for s in ss)  # noqa: E731
    assert names(services_for_pod_change(svcs, None, a)) == ["web"]
    assert names(services_for_pod_change(svcs, a, None)) == ["web"]
    # nothing an endpoint is made of changed: no Service
    touched = pod("a", "10.42.0.1")
    touched["metadata"]["annotations"] = {"x": "y"}
    assert services_for_pod_change(svcs, a, touched) == []
    # relabelled: the Services it left and joined
    moved = pod("a", "10.42.0.1", labels={"app": "db"})
    assert names(services_for_pod_change(svcs, a, moved)) == ["db", "web"]
    # readiness changed: its Services
    assert names(services_for_pod_change(svcs, a, pod("a", "10.42.0.1", ready=False))) == ["web"]
    # a label no selector reads: nothing
    extra = pod("a", "10.42.0.1", labels={"app": "web", "v": "2"})
    assert services_for_pod_change(svcs, a, extra) == []


def test_find_port_restartable_init_containers() -> None:
    p = pod("a")
    p["spec"]["initContainers"] = [{"name": "side", "restartPolicy": "Always",
                                    "ports": [{"name": "metrics", "containerPort": 9100}]},
                                   {"name": "once", "ports": [{"name": "once", "containerPort": 1}]}]
    assert find_port(p, {"port": 80, "targetPort": "metrics", "protocol": "TCP"}) == 9100
    assert find_port(p, {"port": 80, "targetPort": "once", "protocol": "TCP"}) is None
    assert find_port(p, {"port": 80}) == 80


def test_trigger_time_tracker() -> None:
    t = TriggerTimeTracker()
    svc = service()
    a = pod("a", ready_since="2026-01-01T00:01:00Z")
    assert t.compute("k", svc, [a]) is None  # a Service seen for the first time
    assert t.compute("k", svc, [a]) is None  # nothing changed since
    b = pod("b", ready_since="2026-01-01T00:03:00Z")
    a2 = pod("a", ready=False, ready_since="2026-01-01T00:02:00Z")
    assert t.compute("k", svc, [a2, b]) == "2026-01-01T00:02:00Z"  # the earliest change
    assert t.compute("k", svc, [b]) is None  # a pod gone is no trigger time
    t.delete_service("k")
    assert t.compute("k", svc, [b]) is None


def _slice(uid: str, rv: str, svc: str = "web") -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": f"s-{uid}", "uid": uid, "resourceVersion": rv,
                         "labels": {"kubernetes.io/service-name": svc}}}


def test_slice_tracker() -> None:
    tr = SliceTracker()
    key = f"{NS}/web"
    assert tr.should_sync(_slice("1", "10"))  # never wrote it
    tr.update(_slice("1", "10"))
    assert not tr.should_sync(_slice("1", "10"))  # our own write coming back
    assert tr.should_sync(_slice("1", "11"))  # someone else's later write
    assert tr.stale(key, [])  # we created it, the cache has not got it yet
    assert tr.stale(key, [_slice("1", "9")])  # older than our write
    assert not tr.stale(key, [_slice("1", "10")])
    tr.expect_deletion(_slice("1", "10"))
    assert tr.stale(key, [_slice("1", "10")])  # deleted by us, still listed
    assert not tr.stale(key, [])
    assert tr.handle_deletion(_slice("1", "10"))  # expected
    tr.update(_slice("2", "20"))
    assert not tr.handle_deletion(_slice("2", "20"))  # someone else deleted it
    tr.delete_service(key)
    assert not tr.has(_slice("2", "20"))


_ips = st.integers(min_value=1, max_value=12).map(lambda i: f"10.9.0.{i}") | st.sampled_from(["fd00::1", "fd00::2"])
_subsets = st.lists(st.fixed_dictionaries({
    "addresses": st.lists(_ips.map(lambda ip: {"ip": ip}), max_size=4),
    "notReadyAddresses": st.lists(_ips.map(lambda ip: {"ip": ip}), max_size=3),
    "ports": st.lists(st.integers(1, 3).map(lambda p: {"name": f"p{p}", "port": p, "protocol": "TCP"}),
                      max_size=2, unique_by=lambda p: p["port"])}), max_size=4)


@settings(max_examples=150, deadline=None)
@given(before=_subsets, after=_subsets)
def test_mirror_converges_and_keeps_every_fact(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    """From the slices of any earlier Endpoints, one plan mirrors the new ones: every
    (address, port set, readiness) of the repacked subsets is in exactly one slice of
    its family and ports, and planning again does nothing."""
    store = mirror(endpoints(before))
    store = mirror(endpoints(after), store)
    want = sorted((a["ip"], tuple(sorted(p["port"] for p in ss.get("ports") or [])), ready)
                  for ss in repack_subsets(after)
                  for field, ready in (("addresses", True), ("notReadyAddresses", False))
                  for a in ss.get(field) or [])
    got = sorted((e["addresses"][0], tuple(sorted(p["port"] for p in s["ports"])), e["conditions"]["ready"])
                 for s in store.list() for e in s["endpoints"])
    assert got == want
    for s in store.list():
        assert s["endpoints"] and all((":" in e["addresses"][0]) == (s["addressType"] == "IPv6")
                                      for e in s["endpoints"])
    assert plan_mirror(endpoints(after), store.list()).empty
