"""VolumeBinding per node: bound volumes' node affinity, static matches, provisionability.

Two nodes, n1 in zone a and n2 in zone b.  Unless a case says otherwise: class
`wffc` (local.fleet.dev, WaitForFirstConsumer), class `static`
(kubernetes.io/no-provisioner, WaitForFirstConsumer), class `imm` (Immediate);
the local.fleet.dev CSIDriver tracks capacity, both nodes' CSINodes list it and
publish 10Gi for `wffc`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleet.scheduler.framework import Code, FitError, Framework
from fleet.scheduler.plugins import VolumeBinding, default_plugins
from fleet.scheduler.plugins.volume_binding import (
    ERR_REASON_BIND_CONFLICT as BIND,
)
from fleet.scheduler.plugins.volume_binding import (
    ERR_REASON_NODE_CONFLICT as NODE,
)
from fleet.scheduler.plugins.volume_binding import (
    ERR_REASON_NOT_ENOUGH_SPACE as SPACE,
)
from fleet.scheduler.plugins.volume_binding import (
    ERR_REASON_PV_NOT_EXIST as NO_PV,
)
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import HOSTNAME, filter_nodes, new_state, node
from tests.unit.scheduler.volumes import (
    LOCAL_DRIVER,
    capacity,
    claim,
    claim_pod,
    csidriver,
    csinode,
    ref,
    storage_class,
    volume,
)

CLASSES = [storage_class("wffc"), storage_class("static", provisioner="kubernetes.io/no-provisioner"),
           storage_class("imm", mode="Immediate"),
           storage_class("other", provisioner="example.com/not-csi")]
OK = ()


def snapshot(claims: list[dict[str, Any]], pvs: list[dict[str, Any]], *,
             csinodes: list[dict[str, Any]] | None = None, drivers: list[dict[str, Any]] | None = None,
             capacities: list[dict[str, Any]] | None = None,
             classes: list[dict[str, Any]] | None = None) -> Snapshot:
    return Snapshot.build(
        [node("n1", zone="a"), node("n2", zone="b")], pvcs=claims, pvs=pvs,
        storage_classes=CLASSES + (classes or []),
        csinodes=csinodes if csinodes is not None else [csinode("n1", LOCAL_DRIVER), csinode("n2", LOCAL_DRIVER)],
        csidrivers=drivers if drivers is not None else [csidriver()],
        capacities=capacities if capacities is not None else [capacity("n1", "10Gi"), capacity("n2", "10Gi")])


BOUND = claim("data", volume="pv-a", bound=True)
STATIC = claim("data", cls="static")
STATIC2 = claim("logs", cls="static", size="2Gi")
WFFC = claim("data")

CASES: list[tuple[str, tuple[str, ...], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any],
                  dict[str, tuple[str, ...]]]] = [
    # Bound claims: their volume's node affinity decides.
    ("bound, volume pinned to n2", ("data",), [BOUND], [volume("pv-a", node="n2", claim_ref=ref(BOUND))], {},
     {"n1": (NODE,), "n2": OK}),
    ("bound, volume pinned to zone a", ("data",), [BOUND], [volume("pv-a", zone="a", claim_ref=ref(BOUND))], {},
     {"n1": OK, "n2": (NODE,)}),
    ("bound, volume without affinity", ("data",), [BOUND], [volume("pv-a", claim_ref=ref(BOUND))], {},
     {"n1": OK, "n2": OK}),
    ("bound to a volume that does not exist", ("data",), [BOUND], [], {}, {"n1": (NO_PV,), "n2": (NO_PV,)}),
    # Static volumes for WaitForFirstConsumer claims.
    ("static volume on n2", ("data",), [STATIC], [volume("pv-a", node="n2", cls="static")], {},
     {"n1": (BIND,), "n2": OK}),
    ("no static volume, no provisioner", ("data",), [STATIC], [], {}, {"n1": (BIND,), "n2": (BIND,)}),
    ("static volume too small", ("data",), [STATIC], [volume("pv-a", node="n2", cls="static", size="512Mi")],
     {}, {"n1": (BIND,), "n2": (BIND,)}),
    ("static volume of another class", ("data",), [STATIC], [volume("pv-a", node="n2", cls="wffc2")], {},
     {"n1": (BIND,), "n2": (BIND,)}),
    ("static volume bound to another claim", ("data",), [STATIC],
     [volume("pv-a", node="n2", cls="static", phase="Bound",
             claim_ref={"namespace": "default", "name": "other", "uid": "u-other"})], {},
     {"n1": (BIND,), "n2": (BIND,)}),
    ("static volume being released", ("data",), [STATIC], [volume("pv-a", node="n2", cls="static", phase="Released")],
     {}, {"n1": (BIND,), "n2": (BIND,)}),
    ("two claims, one volume on n2", ("data", "logs"), [STATIC, STATIC2],
     [volume("pv-a", node="n2", cls="static", size="5Gi")], {}, {"n1": (BIND,), "n2": (BIND,)}),
    ("two claims, two volumes on n2", ("data", "logs"), [STATIC, STATIC2],
     [volume("pv-a", node="n2", cls="static", size="5Gi"), volume("pv-b", node="n2", cls="static", size="1Gi")],
     {}, {"n1": (BIND,), "n2": OK}),
    ("two claims, a volume on each node", ("data", "logs"), [STATIC, STATIC2],
     [volume("pv-a", node="n1", cls="static", size="5Gi"), volume("pv-b", node="n2", cls="static", size="5Gi")],
     {}, {"n1": (BIND,), "n2": (BIND,)}),
    ("static volume chosen by label selector", ("data",),
     [claim("data", cls="static", selector={"matchLabels": {"disk": "ssd"}})],
     [volume("pv-a", node="n1", cls="static"), volume("pv-b", node="n2", cls="static", labels={"disk": "ssd"})],
     {}, {"n1": (BIND,), "n2": OK}),
    ("pre-bound volume pinned to n2", ("data",), [STATIC],
     [volume("pv-a", node="n2", cls="static", claim_ref=ref(STATIC)),
      volume("pv-b", node="n1", cls="static")], {}, {"n1": (BIND,), "n2": OK}),
    # Provisioning.
    ("provisionable on both", ("data",), [WFFC], [], {}, {"n1": OK, "n2": OK}),
    ("static volume on n1, provisioning elsewhere", ("data",), [WFFC], [volume("pv-a", node="n1")], {},
     {"n1": OK, "n2": OK}),
    ("request above n1's capacity", ("data",), [claim("data", size="20Gi")], [],
     {"capacities": [capacity("n1", "10Gi"), capacity("n2", "50Gi")]}, {"n1": (SPACE,), "n2": OK}),
    ("maximumVolumeSize wins over capacity", ("data",), [claim("data", size="8Gi")], [],
     {"capacities": [capacity("n1", "50Gi", max_size="5Gi"), capacity("n2", "1Gi", max_size="8Gi")]},
     {"n1": (SPACE,), "n2": OK}),
    ("capacity of another class does not count", ("data",), [WFFC], [],
     {"capacities": [capacity("n1", "10Gi", cls="other"), capacity("n2", "10Gi")]},
     {"n1": (SPACE,), "n2": OK}),
    ("no capacity published", ("data",), [WFFC], [], {"capacities": []}, {"n1": (SPACE,), "n2": (SPACE,)}),
    ("driver without capacity tracking", ("data",), [claim("data", size="1Ti")], [],
     {"drivers": [csidriver(capacity=False)], "capacities": []}, {"n1": OK, "n2": OK}),
    ("driver missing from n1's CSINode", ("data",), [WFFC], [],
     {"csinodes": [csinode("n1", "other.example.com"), csinode("n2", LOCAL_DRIVER)]},
     {"n1": (BIND,), "n2": OK}),
    ("n1 has no CSINode", ("data",), [WFFC], [], {"csinodes": [csinode("n2", LOCAL_DRIVER)]},
     {"n1": (BIND,), "n2": OK}),
    ("provisioner that is no CSIDriver: no CSINode or capacity check", ("data",), [claim("data", cls="other")],
     [], {"csinodes": []}, {"n1": OK, "n2": OK}),
    ("allowedTopologies: zone a", ("data",), [claim("data", cls="zonal")], [],
     {"classes": [storage_class("zonal", allowed=[{"matchLabelExpressions": [
         {"key": "topology.kubernetes.io/zone", "values": ["a"]}]}])],
      "capacities": [capacity("n1", "10Gi", cls="zonal"), capacity("n2", "10Gi", cls="zonal")]},
     {"n1": OK, "n2": (BIND,)}),
    ("already given to n2 (selected-node)", ("data",), [claim("data", selected_node="n2")], [], {},
     {"n1": (BIND,), "n2": OK}),
    ("selected node out of space still is the only node", ("data",), [claim("data", selected_node="n2",
                                                                           size="20Gi")], [], {},
     {"n1": (BIND,), "n2": (SPACE,)}),
    # Both kinds at once: every reason of the node is reported, in upstream's order.
    ("bound elsewhere and nothing to bind", ("data", "logs"), [BOUND, STATIC2],
     [volume("pv-a", node="n2", claim_ref=ref(BOUND))], {}, {"n1": (NODE, BIND), "n2": (BIND,)}),
]


@pytest.mark.parametrize(("case", "claim_names", "claims", "pvs", "extra", "want"), CASES,
                         ids=[c[0] for c in CASES])
def test_filter(case: str, claim_names: tuple[str, ...], claims: list[dict[str, Any]],
                pvs: list[dict[str, Any]], extra: dict[str, Any], want: dict[str, tuple[str, ...]]) -> None:
    snap = snapshot(claims, pvs, **extra)
    got = filter_nodes(VolumeBinding(), claim_pod(*claim_names), snap)
    assert {n: st.reasons for n, st in got.items()} == want
    for n, st in got.items():
        assert st.code is (Code.SUCCESS if not want[n] else Code.UNSCHEDULABLE_AND_UNRESOLVABLE), n


def test_filter_without_snapshot_in_state_builds_on_first_node() -> None:
    snap = snapshot([STATIC], [volume("pv-a", node="n2", cls="static")])
    got = filter_nodes(VolumeBinding(), claim_pod("data"), snap, attach=False)
    assert {n: st.reasons for n, st in got.items()} == {"n1": (BIND,), "n2": OK}


def test_filter_records_each_nodes_volumes() -> None:
    claims = [STATIC, claim("logs")]
    snap = snapshot(claims, [volume("pv-a", node="n2", cls="static"), volume("pv-z", node="n2", cls="static",
                                                                           size="100Gi")])
    plugin, state = VolumeBinding(), new_state(snap)
    p = claim_pod("data", "logs")
    assert plugin.pre_filter(state, p).ok
    for n in snap.nodes():
        plugin.filter(state, p, n)
    s = state.read("VolumeBinding")
    assert set(s.by_node) == {"n2"}
    vols = s.by_node["n2"]
    # The smallest volume that fits; the WaitForFirstConsumer claim of `wffc` is provisioned.
    assert [(pv["metadata"]["name"], c["metadata"]["name"]) for pv, c in vols.static_bindings] == [("pv-a", "data")]
    assert [c["metadata"]["name"] for c in vols.provisions] == ["logs"]


def test_a_volume_is_offered_to_one_claim_of_the_pod_only() -> None:
    # Both claims fit pv-a; the smaller claim is matched first and takes it.
    small, big = claim("a", cls="static", size="1Gi"), claim("b", cls="static", size="2Gi")
    snap = snapshot([big, small], [volume("pv-a", node="n1", cls="static", size="2Gi")])
    assert filter_nodes(VolumeBinding(), claim_pod("b", "a"), snap)["n1"].reasons == (BIND,)
    snap.set_pv(volume("pv-b", node="n1", cls="static", size="2Gi"))
    assert filter_nodes(VolumeBinding(), claim_pod("b", "a"), snap)["n1"].ok


def test_pre_filter_rejections_stay_unresolvable_and_skip_without_volumes() -> None:
    snap = snapshot([claim("data", cls="imm")], [])
    st = VolumeBinding().pre_filter(new_state(snap), claim_pod("data"))
    assert st.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert st.reasons == ("pod has unbound immediate PersistentVolumeClaims",)
    # A WaitForFirstConsumer claim naming its volume but not bound yet is the PV controller's.
    snap.set_pvc(claim("data", volume="pv-a"))
    assert VolumeBinding().pre_filter(new_state(snap), claim_pod("data")).reasons == (
        "pod has unbound immediate PersistentVolumeClaims",)
    # PersistentVolumes not listed (a server without the kind): claims only, as before.
    snap.pvs_synced = False
    snap.set_pvc(WFFC)
    assert VolumeBinding().pre_filter(new_state(snap), claim_pod("data")).code is Code.SKIP


def test_failed_scheduling_message_counts_each_reason() -> None:
    snap = snapshot([BOUND], [volume("pv-a", node="n2", claim_ref=ref(BOUND))])
    fw = Framework(default_plugins(), rng=random.Random(1))
    p = claim_pod("data", nodeSelector={HOSTNAME: "n1"})
    with pytest.raises(FitError) as exc:
        fw.schedule(p, snap)
    assert str(exc.value) == ("0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                              "1 node(s) had volume node affinity conflict.")


@pytest.mark.parametrize("seed", range(8))
def test_static_local_volumes_pin_the_pod(seed: int) -> None:
    # Without VolumeBinding both nodes tie; with it, the node holding the volumes wins every time.
    snap = snapshot([STATIC, STATIC2], [volume("pv-a", node="n2", cls="static", size="5Gi"),
                                        volume("pv-b", node="n2", cls="static", size="5Gi")])
    fw = Framework(default_plugins(), rng=random.Random(seed))
    result = fw.schedule(claim_pod("data", "logs"), snap)
    assert result.node == "n2"
    assert result.state is not None and set(result.state.read("VolumeBinding").by_node) == {"n2"}


def test_reserve_promises_volumes_until_unreserved() -> None:
    first, second = claim("a", cls="static"), claim("b", cls="static")
    snap = snapshot([first, second], [volume("pv-a", node="n2", cls="static")])
    fw = Framework(default_plugins(), rng=random.Random(1))
    p1, p2 = claim_pod("a", name="p1"), claim_pod("b", name="p2")
    r1 = fw.schedule(p1, snap)
    assert r1.node == "n2" and r1.state is not None
    assert fw.reserve(r1.state, p1, "n2").ok
    # pv-a is promised to claim a: p2 finds nothing while p1 binds ...
    with pytest.raises(FitError) as exc:
        fw.schedule(p2, snap)
    assert "2 node(s) didn't find available persistent volumes to bind" in str(exc.value)
    # ... but p1 itself (retried) still finds it.
    assert fw.schedule(p1, snap).node == "n2"
    fw.unreserve(r1.state, p1, "n2")
    fw.unreserve(r1.state, p1, "n2")  # idempotent
    assert fw.schedule(p2, snap).node == "n2"


def test_reserve_assumes_the_selected_node_for_provisioning() -> None:
    snap = snapshot([WFFC], [])
    fw = Framework(default_plugins(), rng=random.Random(3))
    p1 = claim_pod("data", name="p1", nodeSelector={HOSTNAME: "n1"})
    r1 = fw.schedule(p1, snap)
    assert r1.state is not None and fw.reserve(r1.state, p1, "n1").ok
    # Another pod sharing the claim must follow it to n1 while the claim is provisioned there.
    for seed in range(5):
        fw.rng = random.Random(seed)
        assert fw.schedule(claim_pod("data", name="p2"), snap).node == "n1"
    fw.unreserve(r1.state, p1, "n1")
    assert {fw.schedule(claim_pod("data", name="p2"), snap).node
            for fw.rng in (random.Random(s) for s in range(12))} == {"n1", "n2"}


def test_reserve_with_all_claims_bound_assumes_nothing() -> None:
    snap = snapshot([BOUND], [volume("pv-a", node="n2", claim_ref=ref(BOUND))])
    fw = Framework(default_plugins(), rng=random.Random(1))
    p = claim_pod("data")
    r = fw.schedule(p, snap)
    assert r.node == "n2" and r.state is not None
    assert fw.reserve(r.state, p, "n2").ok
    assert r.state.read("VolumeBinding").reserved is None
    assert snap.promised_pvs() == set()
