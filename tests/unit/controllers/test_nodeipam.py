"""Node pod-CIDR allocation: the pure allocator and plan."""

from __future__ import annotations

from typing import Any

import pytest
import trio

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


# -- the controller, fed by the manager's informer ----------------------------------------

class _FakeNodes:
    """The client calls NodeIPAM makes (patch), writing into the nodes informer at once."""

    def __init__(self) -> None:
        from fleet.controllers.runtime import Context, InformerFactory

        self.informers = InformerFactory(self)  # type: ignore[arg-type]
        self.ctx = Context(client=self, informers=self.informers)  # type: ignore[arg-type]
        self.rv = 0
        self.nodes: dict[str, dict] = {}

    def node(self, name: str, cidr: str = "") -> dict:
        self.rv += 1
        n = {"kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(self.rv)},
             "spec": {"podCIDR": cidr} if cidr else {}}
        self.nodes[name] = n
        return n

    async def patch(self, api_version: str, plural: str, name: str, patch: dict) -> dict:
        n = self.node(name, patch["spec"]["podCIDR"])
        self.informers.informer("v1", "nodes")._apply("MODIFIED", n)
        return n


async def test_controller_assigns_in_name_order_and_frees_ranges_of_nodes_deleted_while_disconnected() -> None:
    from fleet.controllers.nodeipam import NodeIPAM, NodeIPAMConfig

    fake = _FakeNodes()
    ipam = NodeIPAM(NodeIPAMConfig(cluster_cidr="10.42.0.0/16"))
    ipam.setup(fake.ctx)
    inf = fake.informers.informer("v1", "nodes")
    inf._replace([fake.node("a", "10.42.0.0/24"), fake.node("c"), fake.node("b")])
    inf.synced.set()

    def cidrs() -> dict[str, str]:
        return {k: v["spec"].get("podCIDR", "") for k, v in sorted(fake.nodes.items())}

    async with trio.open_nursery() as n:
        n.start_soon(ipam.run, fake.ctx)
        await trio.sleep(0.1)
        assert cidrs() == {"a": "10.42.0.0/24", "b": "10.42.1.0/24", "c": "10.42.2.0/24"}
        inf._apply("ADDED", fake.node("d"))
        await trio.sleep(0.1)
        assert cidrs()["d"] == "10.42.3.0/24"
        # The watch was lost; c was deleted meanwhile and e created.  The re-list says
        # so (c DELETED), so c's range is free again and the lowest free goes to e.
        del fake.nodes["c"]
        inf._replace([fake.nodes["a"], fake.nodes["b"], fake.nodes["d"], fake.node("e")])
        await trio.sleep(0.1)
        assert cidrs() == {"a": "10.42.0.0/24", "b": "10.42.1.0/24", "d": "10.42.3.0/24", "e": "10.42.2.0/24"}
        n.cancel_scope.cancel()
