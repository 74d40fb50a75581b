"""The Endpoints controller's pure decision: subsets from pods (ready / not ready,
terminating, named ports, headless), RepackSubsets, the 1000-address cap, and when
nothing is written.  Hypothesis checks repacking keeps every (address, port,
readiness) fact and is idempotent, and truncation keeps at most 1000, ready first."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.controllers.endpoints_plan import (
    count_addresses,
    desired_subsets,
    plan_endpoints,
    repack_subsets,
    truncate,
)
from fleet.controllers.endpoints_util import LABEL_HEADLESS, LAST_CHANGE_TRIGGER_TIME, OVER_CAPACITY
from tests.unit.controllers.endpoints_fixtures import NS, pod, service


def ref(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "namespace": NS, "name": name, "uid": f"uid-{name}"}


def addr(name: str, ip: str, node: str = "n1", **extra: Any) -> dict[str, Any]:
    return {"ip": ip, **extra, "nodeName": node, "targetRef": ref(name)}


def test_ready_and_not_ready() -> None:
    pods = [pod("a", "10.42.0.1"), pod("b", "10.42.0.2", ready=False), pod("c", "10.42.0.3", deleting=True),
            pod("d", None), pod("e", "10.42.0.5", phase="Failed")]
    assert desired_subsets(service(), pods) == [{
        "addresses": [addr("a", "10.42.0.1")], "notReadyAddresses": [addr("b", "10.42.0.2")],
        "ports": [{"port": 8080, "protocol": "TCP", "name": "http"}]}]


def test_publish_not_ready_includes_terminating_as_ready() -> None:
    pods = [pod("b", "10.42.0.2", ready=False), pod("c", "10.42.0.3", deleting=True)]
    [ss] = desired_subsets(service(publish=True), pods)
    assert [a["ip"] for a in ss["addresses"]] == ["10.42.0.2", "10.42.0.3"] and "notReadyAddresses" not in ss


def test_named_ports_split_subsets_and_hostname() -> None:
    svc = service(ports=[{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}])
    pods = [pod("a", "10.42.0.1", ports=[{"name": "web", "containerPort": 8080}], hostname="a", subdomain="web"),
            pod("b", "10.42.0.2", ports=[{"name": "web", "containerPort": 9090}]),
            pod("c", "10.42.0.3", ports=[])]  # no such port: not an endpoint
    assert desired_subsets(svc, pods) == [
        {"addresses": [addr("a", "10.42.0.1", hostname="a")], "ports": [{"port": 8080, "protocol": "TCP", "name": "http"}]},
        {"addresses": [addr("b", "10.42.0.2")], "ports": [{"port": 9090, "protocol": "TCP", "name": "http"}]},
    ]


def test_multiple_ports_one_subset() -> None:
    svc = service(ports=[{"name": "a", "port": 80, "protocol": "TCP"}, {"name": "b", "port": 443, "protocol": "TCP"}])
    [ss] = desired_subsets(svc, [pod("x", "10.42.0.1"), pod("y", "10.42.0.2")])
    assert [p["port"] for p in ss["ports"]] == [80, 443] and len(ss["addresses"]) == 2


def test_headless_without_ports_bare_addresses() -> None:
    assert desired_subsets(service(cluster_ip="None", ports=[]), [pod("a", "10.42.0.1")]) == [
        {"addresses": [addr("a", "10.42.0.1")]}]
    assert desired_subsets(service(ports=[]), [pod("a", "10.42.0.1")]) == []


def test_repack_not_ready_trumps_ready() -> None:
    a = addr("a", "10.0.0.1")
    got = repack_subsets([{"addresses": [a], "ports": [{"port": 1, "protocol": "TCP"}]},
                          {"notReadyAddresses": [a], "ports": [{"port": 1, "protocol": "TCP"}]}])
    assert got == [{"notReadyAddresses": [a], "ports": [{"port": 1, "protocol": "TCP"}]}]


def test_repack_sorts_addresses_as_bytes() -> None:
    got = repack_subsets([{"addresses": [addr("a", "10.0.0.10"), addr("b", "10.0.0.9")],
                           "ports": [{"port": 1, "protocol": "TCP"}]}])
    assert [a["ip"] for a in got[0]["addresses"]] == ["10.0.0.10", "10.0.0.9"]


@pytest.mark.parametrize("ready,not_ready,want_ready,want_not_ready", [
    (1200, 0, 1000, 0),
    (900, 300, 900, 100),
    (0, 1500, 0, 1000),
    (1000, 0, 1000, 0),
])
def test_truncate_counts(ready: int, not_ready: int, want_ready: int, want_not_ready: int) -> None:
    ss = [{"addresses": [{"ip": f"10.0.{i // 250}.{i % 250}"} for i in range(ready)],
           "notReadyAddresses": [{"ip": f"10.1.{i // 250}.{i % 250}"} for i in range(not_ready)]}]
    out, cut = truncate(ss)
    assert cut == (ready + not_ready > 1000)
    assert len(out[0].get("addresses") or []) == want_ready
    assert len(out[0].get("notReadyAddresses") or []) == want_not_ready


# ---------------------------------------------------------------------------------------
# plan_endpoints


def test_create_body() -> None:
    body = plan_endpoints(service(labels={"app": "web"}), [pod("a", "10.42.0.1")], None,
                          trigger_time="2026-01-01T00:01:00Z")
    assert body is not None
    assert body["metadata"] == {"name": "web", "namespace": NS, "labels": {"app": "web"},
                                "annotations": {LAST_CHANGE_TRIGGER_TIME: "2026-01-01T00:01:00Z"}}
    assert body["subsets"][0]["addresses"][0]["ip"] == "10.42.0.1"


def test_headless_label_and_no_subsets() -> None:
    body = plan_endpoints(service(cluster_ip="None"), [], None)
    assert body is not None and body["metadata"]["labels"] == {LABEL_HEADLESS: ""} and "subsets" not in body


def stored(body: dict[str, Any], rv: str = "7") -> dict[str, Any]:
    body = dict(body, metadata=dict(body["metadata"], resourceVersion=rv, uid="ep-uid"))
    return body


def test_equal_means_no_write_even_in_another_order() -> None:
    pods = [pod("a", "10.42.0.1"), pod("b", "10.42.0.2"), pod("c", "10.42.0.3", ready=False)]
    body = plan_endpoints(service(), pods, None)
    assert body is not None
    cur = stored(body)
    assert plan_endpoints(service(), list(reversed(pods)), cur, trigger_time="2026-01-01T00:09:00Z") is None
    # a targetRef resourceVersion makes no difference
    cur["subsets"][0]["addresses"][0]["targetRef"]["resourceVersion"] = "42"
    assert plan_endpoints(service(), pods, cur) is None


def test_update_keeps_resource_version_and_labels_follow_service() -> None:
    body = plan_endpoints(service(), [pod("a", "10.42.0.1")], None)
    assert body is not None
    upd = plan_endpoints(service(labels={"x": "y"}), [pod("a", "10.42.0.1")], stored(body))
    assert upd is not None and upd["metadata"]["resourceVersion"] == "7" and upd["metadata"]["labels"] == {"x": "y"}


def test_over_capacity_annotation_set_and_cleared() -> None:
    many = [pod(f"p{i}", f"10.42.{i // 250}.{i % 250 + 1}") for i in range(1005)]
    body = plan_endpoints(service(), many, None)
    assert body is not None
    assert body["metadata"]["annotations"][OVER_CAPACITY] == "truncated"
    assert count_addresses(body["subsets"]) == 1000
    assert plan_endpoints(service(), many, stored(body)) is None  # stable while over capacity
    fewer = plan_endpoints(service(), many[:10], stored(body))
    assert fewer is not None and "annotations" not in fewer["metadata"]


# ---------------------------------------------------------------------------------------
# The algebra

ips = st.integers(min_value=1, max_value=30).map(lambda i: f"10.9.0.{i}")
ports = st.integers(min_value=1, max_value=4)
raw_subsets = st.lists(st.fixed_dictionaries({
    "addresses": st.lists(ips, max_size=4), "notReadyAddresses": st.lists(ips, max_size=3),
    "ports": st.lists(ports, max_size=3, unique=True)}), max_size=6)


def _raw(subsets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"addresses": [{"ip": i} for i in s["addresses"]],
             "notReadyAddresses": [{"ip": i} for i in s["notReadyAddresses"]],
             "ports": [{"port": p, "protocol": "TCP", "name": f"p{p}"} for p in s["ports"]]} for s in subsets]


def _facts(subsets: list[dict[str, Any]]) -> dict[tuple[str, int], bool]:
    """(ip, port) -> ready, with not-ready winning (port 0: no ports)."""
    out: dict[tuple[str, int], bool] = {}
    for s in subsets:
        for key, ready in (("addresses", True), ("notReadyAddresses", False)):
            for a in s.get(key) or []:
                for p in [p["port"] for p in s.get("ports") or []] or [0]:
                    out[(a["ip"], p)] = out.get((a["ip"], p), True) and ready
    return out


@settings(max_examples=200, deadline=None)
@given(raw=raw_subsets)
def test_repack_keeps_facts_and_is_canonical(raw: list[dict[str, Any]]) -> None:
    subsets = _raw(raw)
    packed = repack_subsets(subsets)
    want, got = _facts(subsets), _facts(packed)
    assert {k: v for k, v in got.items() if k[1]} == {k: v for k, v in want.items() if k[1]}
    # As RepackSubsets: a port-less subset whose addresses equal a ported group's
    # joins that group (the no-port sentinel is dropped), so only its addresses stay.
    assert all(want.get(k) == v for k, v in got.items() if not k[1])
    assert {ip for ip, _ in got} == {ip for ip, _ in want}
    assert repack_subsets(packed) == packed
    assert repack_subsets(list(reversed(subsets))) == packed
    # each port is in one subset only
    seen = [p["port"] for s in packed for p in s.get("ports") or []]
    assert len(seen) == len(set(seen))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 700)), min_size=1, max_size=4))
def test_truncate_caps_and_prefers_ready(sizes: list[tuple[int, int]]) -> None:
    subsets = [{"addresses": [{"ip": "r"}] * r, "notReadyAddresses": [{"ip": "n"}] * n} for r, n in sizes]
    ready = sum(r for r, _ in sizes)
    out, cut = truncate(subsets)
    assert count_addresses(out) <= 1000
    assert cut == (count_addresses(subsets) > 1000)
    kept_ready = sum(len(s.get("addresses") or []) for s in out)
    if cut:
        assert kept_ready == min(ready, 1000)  # ready addresses go first
        assert count_addresses(out) == 1000
    else:
        assert out == subsets
