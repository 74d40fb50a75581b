"""pvmatch's scheduler-side rules: class topology, CSIStorageCapacity, CSINode, binding a
volume to a claim, and pre-bound volumes a node cannot use."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api.pvmatch import (
    BOUND_BY_CONTROLLER,
    bind_volume_to_claim,
    capacity_admits_node,
    capacity_limit,
    csinode_has_driver,
    find_matching_volume,
    has_enough_capacity,
    topology_allows,
)
from tests.unit.scheduler.volumes import capacity, claim, csidriver, csinode, ref, volume

ZONE = "topology.kubernetes.io/zone"
N1 = {"kubernetes.io/hostname": "n1", ZONE: "a", "disk": "ssd"}


@pytest.mark.parametrize(("allowed", "want"), [
    (None, True),
    ([], True),
    ([{"matchLabelExpressions": [{"key": ZONE, "values": ["a", "b"]}]}], True),
    ([{"matchLabelExpressions": [{"key": ZONE, "values": ["b"]}]}], False),
    ([{"matchLabelExpressions": [{"key": ZONE, "values": ["b"]}]},
      {"matchLabelExpressions": [{"key": "disk", "values": ["ssd"]}]}], True),  # terms are ORed
    ([{"matchLabelExpressions": [{"key": ZONE, "values": ["a"]}, {"key": "disk", "values": ["hdd"]}]}],
     False),  # expressions ANDed
    ([{"matchLabelExpressions": [{"key": "rack", "values": ["r1"]}]}], False),  # label missing
])
def test_topology_allows(allowed: Any, want: bool) -> None:
    assert topology_allows(allowed, N1) is want


@pytest.mark.parametrize(("cap", "limit"), [
    ({"capacity": "10Gi"}, 10 * 2**30),
    ({"capacity": "10Gi", "maximumVolumeSize": "2Gi"}, 2 * 2**30),
    ({}, None),
    ({"capacity": "not a quantity"}, None),
])
def test_capacity_limit(cap: dict[str, Any], limit: int | None) -> None:
    got = capacity_limit(cap)
    assert (None if got is None else int(got)) == limit


def test_capacity_admits_node_by_topology() -> None:
    assert capacity_admits_node(capacity("n1", "1Gi"), N1)
    assert not capacity_admits_node(capacity("n2", "1Gi"), N1)
    assert not capacity_admits_node({"capacity": "1Gi"}, N1)  # no nodeTopology: nobody
    assert capacity_admits_node({"nodeTopology": {}}, N1)  # an empty selector: everybody


@pytest.mark.parametrize(("case", "c", "driver", "caps", "want"), [
    ("fits", claim("d", size="5Gi"), csidriver(), [capacity("n1", "10Gi")], True),
    ("exactly", claim("d", size="10Gi"), csidriver(), [capacity("n1", "10Gi")], True),
    ("too big", claim("d", size="11Gi"), csidriver(), [capacity("n1", "10Gi")], False),
    ("other node's capacity", claim("d", size="1Gi"), csidriver(), [capacity("n2", "10Gi")], False),
    ("other class", claim("d", size="1Gi"), csidriver(), [capacity("n1", "10Gi", cls="x")], False),
    ("no CSIDriver", claim("d", size="1Ti"), None, [], True),
    ("no capacity tracking", claim("d", size="1Ti"), csidriver(capacity=False), [], True),
    ("any fitting pool", claim("d", size="5Gi"), csidriver(), [capacity("n1", "1Gi"),
                                                              {**capacity("n1", "9Gi"), "metadata": {"name": "b"}}],
     True),
])
def test_has_enough_capacity(case: str, c: dict[str, Any], driver: Any, caps: list[dict[str, Any]],
                             want: bool) -> None:
    assert has_enough_capacity(c, "wffc", driver, caps, N1) is want


def test_csinode_has_driver() -> None:
    assert csinode_has_driver(csinode("n1", "a", "b"), "b")
    assert not csinode_has_driver(csinode("n1", "a"), "b")
    assert not csinode_has_driver(None, "b")


def test_bind_volume_to_claim() -> None:
    c = claim("data")
    pv = volume("pv-a")
    new, dirty = bind_volume_to_claim(pv, c)
    assert dirty
    assert new["spec"]["claimRef"] == {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                                       "name": "data", "uid": "uid-data", "resourceVersion": "10"}
    assert new["metadata"]["annotations"] == {BOUND_BY_CONTROLLER: "yes"}
    assert "claimRef" not in pv["spec"] and "annotations" not in pv["metadata"]  # the input is untouched
    again, dirty = bind_volume_to_claim(new, c)
    assert not dirty and again == new
    # Pre-bound by the user (claimRef with the uid): nothing to change, no bound-by-controller.
    user, dirty = bind_volume_to_claim(volume("pv-b", claim_ref=ref(c)), c)
    assert not dirty and BOUND_BY_CONTROLLER not in (user["metadata"].get("annotations") or {})
    # Pre-bound by name only: the uid is filled in.
    named, dirty = bind_volume_to_claim(volume("pv-c", claim_ref={"namespace": "default", "name": "data"}), c)
    assert dirty and named["spec"]["claimRef"]["uid"] == "uid-data"


def test_a_pre_bound_volume_the_node_cannot_use_is_no_match() -> None:
    c = claim("data")
    pinned = volume("pv-a", node="n2", claim_ref=ref(c))
    other = volume("pv-b", node="n1")
    assert find_matching_volume(c, [pinned, other], node_labels=N1, node_name="n1", delay_binding=True) is None
    assert find_matching_volume(c, [pinned, other], node_labels={"kubernetes.io/hostname": "n2"},
                                node_name="n2", delay_binding=True) is pinned
    assert find_matching_volume(c, [pinned, other]) is pinned  # the PV controller has no node
