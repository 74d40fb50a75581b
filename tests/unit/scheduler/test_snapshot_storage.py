"""The snapshot's storage side: volumes by class, CSI objects, capacities by class, and
the volume decisions pods being bound have assumed."""

from __future__ import annotations

import pytest

from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import node
from tests.unit.scheduler.volumes import capacity, claim, csidriver, csinode, volume


def names(objs: object) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)  # type: ignore[attr-defined]


def test_volumes_are_kept_by_class_and_follow_a_class_change() -> None:
    snap = Snapshot.build([node("n1")], pvs=[volume("a", cls="fast"), volume("b", cls="fast"),
                                             volume("c", cls="slow")])
    assert snap.pvs_synced
    assert names(snap.pvs_of_class("fast")) == ["a", "b"]
    assert names(snap.pvs_of_class("slow")) == ["c"]
    assert list(snap.pvs_of_class("none")) == []
    snap.set_pv(volume("b", cls="slow"))  # an update that moves it
    assert names(snap.pvs_of_class("fast")) == ["a"]
    assert names(snap.pvs_of_class("slow")) == ["b", "c"]
    snap.remove_pv("a")
    snap.remove_pv("a")  # unknown: ignored
    assert list(snap.pvs_of_class("fast")) == [] and "fast" not in snap._pvs_by_class
    assert snap.pv("b") is not None and snap.pv("a") is None


def test_volumes_unsynced_until_listed() -> None:
    assert not Snapshot.build([node("n1")]).pvs_synced
    assert Snapshot.build([node("n1")], pvs=[]).pvs_synced


def test_csi_objects_and_capacities() -> None:
    snap = Snapshot.build([node("n1")], csinodes=[csinode("n1", "d")], csidrivers=[csidriver("d")],
                          capacities=[capacity("n1", "1Gi", cls="fast"), capacity("n2", "2Gi", cls="fast")])
    assert snap.csinode("n1") is not None and snap.csinode("n2") is None
    assert snap.csidriver("d") is not None
    assert len(list(snap.capacities_of_class("fast"))) == 2
    # An update under the same name replaces it; a class change moves it.
    moved = capacity("n1", "5Gi", cls="fast")
    moved["storageClassName"] = "slow"
    snap.set_capacity(moved)
    assert [c["capacity"] for c in snap.capacities_of_class("fast")] == ["2Gi"]
    assert [c["capacity"] for c in snap.capacities_of_class("slow")] == ["5Gi"]
    snap.remove_capacity("kube-system/csisc-n2-fast")
    assert list(snap.capacities_of_class("fast")) == []
    snap.remove_csinode("n1")
    snap.remove_csidriver("d")
    assert snap.csinode("n1") is None and snap.csidriver("d") is None


def test_promised_volumes() -> None:
    snap = Snapshot()
    snap.promise_pv("pv-a", "ns/a")
    snap.promise_pv("pv-b", "ns/b")
    assert snap.promised_pvs() == {"pv-a", "pv-b"}
    assert snap.promised_pvs("ns/a") == {"pv-b"}  # a claim is never kept from its own volume
    snap.release_pv("pv-a", "ns/other")  # someone else's promise: untouched
    assert snap.promised_pvs() == {"pv-a", "pv-b"}
    snap.release_pv("pv-a", "ns/a")
    assert snap.promised_pvs() == {"pv-b"}


@pytest.mark.parametrize(("annotated", "assumed", "want"), [
    (None, None, None),
    ("n1", None, "n1"),
    (None, "n2", "n2"),
    ("n1", "n2", "n2"),  # the pod being bound right now has the latest word
])
def test_selected_node(annotated: str | None, assumed: str | None, want: str | None) -> None:
    snap = Snapshot()
    c = claim("data", selected_node=annotated)
    if assumed:
        snap.assume_selected_node("default/data", assumed)
    assert snap.selected_node(c) == want
    if assumed:
        snap.forget_selected_node("default/data", "elsewhere")  # not ours: kept
        assert snap.selected_node(c) == want
        snap.forget_selected_node("default/data", assumed)
        assert snap.selected_node(c) == annotated
