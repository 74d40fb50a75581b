"""Node pod-CIDR allocation: the pure allocator and plan."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.controllers.nodeipam import CIDRAllocator, CIDRExhausted, plan


def node(name: str, cidr: str | None = None) -> dict[str, Any]:
    spec = {"podCIDR": cidr, "podCIDRs": [cidr]} if cidr else {}
    return {"metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(("nodes", "want"), [
    ([], {}),
    ([node("a"), node("b")], {"a": "10.42.0.0/24", "b": "10.42.1.0/24"}),
    # Ranges already on nodes are never handed out again, and holes are reused.
    ([node("a", "10.42.0.0/24"), node("b", "10.42.2.0/24"), node("c"), node("d")],
     {"c": "10.42.1.0/24", "d": "10.42.3.0/24"}),
    # Name order, not list order.
    ([node("z"), node("a")], {"a": "10.42.0.0/24", "z": "10.42.1.0/24"}),
    # A range outside the cluster CIDR (set by hand) does not block ours.
    ([node("a", "192.168.7.0/24"), node("b")], {"b": "10.42.0.0/24"}),
])
def test_plan(nodes, want):
    assert plan(nodes, CIDRAllocator()) == want


def test_release_and_reuse():
    alloc = CIDRAllocator("10.0.0.0/22", 24)
    got = [alloc.allocate() for _ in range(4)]
    assert got == ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24"]
    with pytest.raises(CIDRExhausted):
        alloc.allocate()
    alloc.release("10.0.2.0/24")
    assert alloc.allocate() == "10.0.2.0/24"


def test_exhaustion_leaves_the_rest_unassigned():
    alloc = CIDRAllocator("10.0.0.0/23", 24)
    assert plan([node("a"), node("b"), node("c")], alloc) == {"a": "10.0.0.0/24", "b": "10.0.1.0/24"}


@pytest.mark.parametrize(("cidr", "ours"), [
    ("10.42.5.0/24", True),
    ("10.42.5.7/24", True),  # host bits set: still that range
    ("10.42.5.0/25", False),
    ("10.43.0.0/24", False),
    ("fd00::/64", False),
    ("garbage", False),
])
def test_occupy_only_our_ranges(cidr, ours):
    alloc = CIDRAllocator()
    assert alloc.occupy(cidr) is ours
    assert alloc.is_used(cidr) is ours


@pytest.mark.parametrize(("cluster", "mask"), [("10.42.0.0/16", 8), ("fd00::/48", 64), ("10.0.0.0/8", 33)])
def test_bad_configuration(cluster, mask):
    with pytest.raises(ValueError):
        CIDRAllocator(cluster, mask)
