"""The pod network across nodes as pure decisions: peers from Nodes, the backend per
peer, the desired routes/neighbours/FDB, the plan against the kernel's state, and the
VTEP annotation (fleet/network/peers.py)."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from fleet.network import peers as P
from fleet.network.peers import Connected, Peer, Route, State

MAC_B = "0a:00:00:00:00:0b"
MAC_C = "0a:00:00:00:00:0c"
ETH0 = Connected(ipaddress.IPv4Network("198.18.1.0/24"), "eth0")
ETH1 = Connected(ipaddress.IPv4Network("198.18.0.0/16"), "eth1")


def node(name: str, cidr: str | None, ip: str | None, mac: str | None = None,
         **meta: Any) -> dict[str, Any]:
    ann = {P.BACKEND_DATA_ANNOTATION: P.backend_data(mac)} if mac else {}
    if ip:
        ann[P.PUBLIC_IP_ANNOTATION] = ip
    return {"metadata": {"name": name, "annotations": ann, **meta},
            "spec": {"podCIDR": cidr} if cidr else {},
            "status": {"addresses": [{"type": "Hostname", "address": name},
                                     {"type": "InternalIP", "address": ip or "198.18.1.99"}]}}


def test_peers_from_nodes_skip_self_unready_and_deleting() -> None:
    nodes = [
        node("a", "10.42.1.0/24", "198.18.1.10"),
        node("b", "10.42.2.0/24", "198.18.1.11", MAC_B),
        node("c", None, "198.18.1.12"),                   # no pod CIDR yet
        node("d", "10.42.4.0/24", None),                  # not in the pod network (simulated,
                                                          # another driver, not started yet)
        node("g", "10.42.6.0/24", "not-an-ip"),
        node("e", "10.42.5.0/24", "198.18.1.14", deletionTimestamp="2026-01-01T00:00:00Z"),
        node("f", "not-a-cidr", "198.18.1.15"),
        {"metadata": "broken"},
    ]
    assert P.peers_from_nodes(nodes, "a") == [Peer("b", "10.42.2.0/24", "198.18.1.11", MAC_B)]


@pytest.mark.parametrize(("value", "mac"), [
    (P.backend_data(MAC_B), MAC_B),
    ('{"VNI":1,"VtepMAC":"0A:00:00:00:00:0B"}', MAC_B),
    ("not json", None),
    ('{"VNI":1}', None),
    ('{"VtepMAC":"zz:00:00:00:00:0b"}', None),
    ('{"VtepMAC":"0a:00:00:00:0b"}', None),
    ("[1, 2]", None),
    (None, None),
    (7, None),
])
def test_backend_data_round_trip_and_bad_values(value: Any, mac: str | None) -> None:
    assert P.parse_backend_data(value) == mac


def test_backend_data_is_flannels_shape() -> None:
    assert json.loads(P.backend_data(MAC_B)) == {"VNI": 1, "VtepMAC": MAC_B}
    assert P.vtep_address("10.42.7.0/24") == "10.42.7.0"


@pytest.mark.parametrize(("mode", "address", "connected", "want"), [
    ("auto", "198.18.1.11", [ETH0], P.HOST_GW),
    ("auto", "198.18.2.11", [ETH0], P.VXLAN),
    ("auto", "198.18.2.11", [], P.VXLAN),
    ("host-gw", "198.18.2.11", [ETH0], P.HOST_GW),
    ("vxlan", "198.18.1.11", [ETH0], P.VXLAN),
])
def test_choose_backend(mode: str, address: str, connected: list[Connected], want: str) -> None:
    assert P.choose_backend(mode, address, connected) == want


def test_connected_dev_takes_the_longest_prefix() -> None:
    assert P.connected_dev("198.18.1.5", [ETH1, ETH0]) == "eth0"
    assert P.connected_dev("198.18.9.5", [ETH1, ETH0]) == "eth1"
    assert P.connected_dev("10.0.0.1", [ETH1, ETH0]) is None


B = Peer("b", "10.42.2.0/24", "198.18.1.11", MAC_B)
C = Peer("c", "10.42.3.0/24", "198.18.2.12", MAC_C)  # another subnet


def desired(peer_list: list[Peer], mode: str = "auto") -> P.Desired:
    return P.desired_state(peer_list, mode=mode, own_pod_cidr="10.42.1.0/24",
                           own_address="198.18.1.10", connected=[ETH0])


@pytest.mark.parametrize(("peer_list", "mode", "routes", "neighbors", "fdb", "skipped", "vx"), [
    pytest.param([], "auto", {}, {}, {}, {}, False, id="alone"),
    pytest.param([B], "auto", {"10.42.2.0/24": Route("10.42.2.0/24", "198.18.1.11", "eth0")},
                 {}, {}, {}, False, id="host-gw on the same segment"),
    pytest.param([B, C], "auto",
                 {"10.42.2.0/24": Route("10.42.2.0/24", "198.18.1.11", "eth0"),
                  "10.42.3.0/24": Route("10.42.3.0/24", "10.42.3.0", "fleet.1", onlink=True)},
                 {"10.42.3.0": MAC_C}, {MAC_C: "198.18.2.12"}, {}, True, id="auto mixes"),
    pytest.param([B], "vxlan",
                 {"10.42.2.0/24": Route("10.42.2.0/24", "10.42.2.0", "fleet.1", onlink=True)},
                 {"10.42.2.0": MAC_B}, {MAC_B: "198.18.1.11"}, {}, True, id="vxlan forced"),
    pytest.param([C], "host-gw", {}, {}, {}, {"c": "host-gw needs"}, False,
                 id="host-gw cannot reach another subnet"),
    pytest.param([Peer("c", "10.42.3.0/24", "198.18.2.12")], "auto", {}, {}, {},
                 {"c": "not published its VTEP MAC"}, True, id="vtep not published yet"),
    pytest.param([Peer("x", "10.42.1.0/25", "198.18.1.20")], "auto", {}, {}, {},
                 {"x": "overlaps ours"}, False, id="overlapping pod CIDR"),
    pytest.param([Peer("x", "10.42.9.0/24", "198.18.1.10")], "auto", {}, {}, {},
                 {"x": "our address"}, False, id="our own address"),
    pytest.param([B, Peer("z", "10.42.2.0/24", "198.18.1.30")], "auto",
                 {"10.42.2.0/24": Route("10.42.2.0/24", "198.18.1.11", "eth0")}, {}, {},
                 {"z": "already has pod CIDR"}, False, id="duplicate pod CIDR: first wins"),
])
def test_desired_state(peer_list: list[Peer], mode: str, routes: dict[str, Route],
                       neighbors: dict[str, str], fdb: dict[str, str], skipped: dict[str, str],
                       vx: bool) -> None:
    d = desired(peer_list, mode)
    assert d.state.routes == routes
    assert d.state.neighbors == neighbors
    assert d.state.fdb == fdb
    assert set(d.skipped) == set(skipped)
    for name, why in skipped.items():
        assert why in d.skipped[name]
    assert d.needs_vxlan is vx


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pod network backend 'flat'"):
        desired([B], "flat")


R_B = Route("10.42.2.0/24", "198.18.1.11", "eth0")
R_B_VX = Route("10.42.2.0/24", "10.42.2.0", "fleet.1", onlink=True)
R_C = Route("10.42.3.0/24", "10.42.3.0", "fleet.1", onlink=True)


@pytest.mark.parametrize(("want", "have", "expect"), [
    pytest.param(State(), State(), P.Plan(), id="nothing"),
    pytest.param(State(routes={R_B.dst: R_B}), State(routes={R_B.dst: R_B}), P.Plan(),
                 id="in sync: no change"),
    pytest.param(State(routes={R_B.dst: R_B}), State(), P.Plan(route_replace=(R_B,)),
                 id="new peer"),
    pytest.param(State(), State(routes={R_B.dst: R_B}), P.Plan(route_delete=(R_B,)),
                 id="peer gone"),
    pytest.param(State(routes={R_B.dst: R_B_VX}), State(routes={R_B.dst: R_B}),
                 P.Plan(route_replace=(R_B_VX,)), id="backend switched: replaced, not deleted"),
    pytest.param(
        State(routes={R_C.dst: R_C}, neighbors={"10.42.3.0": MAC_C}, fdb={MAC_C: "198.18.2.12"}),
        State(routes={R_C.dst: R_C, R_B_VX.dst: R_B_VX},
              neighbors={"10.42.3.0": "0a:00:00:00:00:ff", "10.42.2.0": MAC_B},
              fdb={MAC_C: "198.18.2.99", MAC_B: "198.18.1.11"}),
        P.Plan(route_delete=(R_B_VX,), neigh_replace=(("10.42.3.0", MAC_C),),
               neigh_delete=(("10.42.2.0", MAC_B),), fdb_replace=((MAC_C, "198.18.2.12"),),
               fdb_delete=((MAC_B, "198.18.1.11"),)),
        id="peer moved (new MAC, new address) and another left"),
])
def test_plan(want: State, have: State, expect: P.Plan) -> None:
    got = P.plan(want, have)
    assert got == expect
    assert got.empty == (expect == P.Plan())


def test_a_node_leaving_removes_exactly_its_entries() -> None:
    before = desired([B, C], "vxlan").state
    after = desired([B], "vxlan").state
    p = P.plan(after, before)
    assert p.route_delete == (R_C,) and not p.route_replace
    assert p.neigh_delete == (("10.42.3.0", MAC_C),) and p.fdb_delete == ((MAC_C, "198.18.2.12"),)
    assert not p.neigh_replace and not p.fdb_replace


def test_a_route_of_someone_else_is_never_replaced() -> None:
    want = State(routes={R_B.dst: R_B, R_C.dst: R_C})
    p = P.plan(want, State(foreign=frozenset({R_B.dst, "10.0.0.0/8"})))
    assert p.route_replace == (R_C,) and p.conflicts == (R_B,) and not p.route_delete
