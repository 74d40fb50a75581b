"""Stale UDP conntrack clean-up: which flows a sync from one state to the next deletes,
the renderer's record of UDP ports, and `ServiceRules` calling the deleter."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.network.proxy_conntrack import FlowFilter as F
from fleet.network.proxy_conntrack import matches, stale_flows
from fleet.network.proxy_rules import ProxyOptions, Renderer
from fleet.network.service_proxy import CONNTRACK_FAILURES, ServiceRules
from tests.unit.network.proxy_objects import ep, eps, svc

OPTS = ProxyOptions(node_name="n1")
UDP = [{"name": "dns", "port": 53, "protocol": "UDP"}]
UDP_EP = [{"name": "dns", "port": 5353, "protocol": "UDP"}]
TCP_EP = [{"name": "dns", "port": 5353, "protocol": "TCP"}]


def dns(**spec: Any) -> dict[str, Any]:
    return svc("dns", ip="10.43.0.10", ports=[dict(p) for p in spec.pop("ports", UDP)], **spec)


def state(services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> Any:
    r = Renderer(OPTS)
    r.render(services, slices)
    return r.udp_ports


def udp_eps(*ips: str, **ready: bool) -> dict[str, Any]:
    return eps("dns", [ep(ip, ready=ready.get(ip.replace(".", "_"), True)) for ip in ips], ports=UDP_EP)


NODEPORT = {"type": "NodePort", "ports": [{**UDP[0], "nodePort": 30053}]}
LB = {"type": "LoadBalancer", "externalIPs": ["198.51.100.7"],
      "ports": [{**UDP[0], "nodePort": 30053}],
      "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}

CASES: list[tuple[str, Any, Any, list[F]]] = [
    ("no change", ([dns()], [udp_eps("10.42.0.2")]), ([dns()], [udp_eps("10.42.0.2")]), []),
    ("an endpoint added: nothing stale", ([dns()], [udp_eps("10.42.0.2")]),
     ([dns()], [udp_eps("10.42.0.2", "10.42.0.3")]), []),
    ("an endpoint removed: flows to the ClusterIP:port it answered",
     ([dns()], [udp_eps("10.42.0.2", "10.42.0.3")]), ([dns()], [udp_eps("10.42.0.3")]),
     [F("10.43.0.10", 53, "10.42.0.2")]),
    ("an endpoint no longer serving counts as removed",
     ([dns()], [udp_eps("10.42.0.2", "10.42.0.3")]),
     ([dns()], [eps("dns", [ep("10.42.0.2", ready=False, serving=False), ep("10.42.0.3")],
                    ports=UDP_EP)]),
     [F("10.43.0.10", 53, "10.42.0.2")]),
    ("not ready but still serving (terminating) keeps its flows",
     ([dns()], [udp_eps("10.42.0.2", "10.42.0.3")]),
     ([dns()], [eps("dns", [ep("10.42.0.2", ready=False, serving=True, terminating=True),
                            ep("10.42.0.3")], ports=UDP_EP)]), []),
    ("the last endpoint removed: its flows, and no 'newly active'",
     ([dns()], [udp_eps("10.42.0.2")]), ([dns()], []), [F("10.43.0.10", 53, "10.42.0.2")]),
    ("endpoint port changed: flows by IP",
     ([dns()], [udp_eps("10.42.0.2")]),
     ([dns()], [eps("dns", [ep("10.42.0.2")], ports=[{**UDP_EP[0], "port": 5354}])]),
     [F("10.43.0.10", 53, "10.42.0.2")]),
    ("no endpoints to some: every flow to the frontends (made while rejecting)",
     ([dns()], []), ([dns()], [udp_eps("10.42.0.2")]), [F("10.43.0.10", 53)]),
    ("a new Service with endpoints: its ClusterIP:port",
     ([], []), ([dns()], [udp_eps("10.42.0.2")]), [F("10.43.0.10", 53)]),
    ("a deleted Service: flows to its endpoints",
     ([dns()], [udp_eps("10.42.0.2")]), ([], []), [F("10.43.0.10", 53, "10.42.0.2")]),
    ("NodePort: by port too",
     ([dns(**NODEPORT)], [udp_eps("10.42.0.2", "10.42.0.3")]),
     ([dns(**NODEPORT)], [udp_eps("10.42.0.3")]),
     [F(None, 30053, "10.42.0.2"), F("10.43.0.10", 53, "10.42.0.2")]),
    ("LoadBalancer + externalIPs: every frontend",
     ([dns(**LB)], [udp_eps("10.42.0.2", "10.42.0.3")]), ([dns(**LB)], [udp_eps("10.42.0.3")]),
     [F(None, 30053, "10.42.0.2"), F("10.43.0.10", 53, "10.42.0.2"),
      F("192.0.2.1", 53, "10.42.0.2"), F("198.51.100.7", 53, "10.42.0.2")]),
    ("newly active NodePort/LB: all frontends and the NodePort",
     ([dns(**LB)], []), ([dns(**LB)], [udp_eps("10.42.0.3")]),
     [F(None, 30053), F("10.43.0.10", 53), F("192.0.2.1", 53), F("198.51.100.7", 53)]),
    ("TCP ports: never", ([dns(ports=[{**UDP[0], "protocol": "TCP"}])],
                          [eps("dns", [ep("10.42.0.2"), ep("10.42.0.3")], ports=TCP_EP)]),
     ([dns(ports=[{**UDP[0], "protocol": "TCP"}])], [eps("dns", [ep("10.42.0.3")], ports=TCP_EP)]), []),
    ("two Services: only the changed one",
     ([dns(), svc("other", ip="10.43.0.11", ports=UDP)],
      [udp_eps("10.42.0.2"), eps("other", [ep("10.42.0.9")], ports=UDP_EP)]),
     ([dns(), svc("other", ip="10.43.0.11", ports=UDP)],
      [udp_eps("10.42.0.2"), eps("other", [ep("10.42.0.8")], ports=UDP_EP)]),
     [F("10.43.0.11", 53, "10.42.0.9")]),
]


@pytest.mark.parametrize(("old", "new", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_stale_flows(old: Any, new: Any, want: list[F]) -> None:
    assert stale_flows(state(*old), state(*new)) == want


def test_first_sync_reconciles_ports_with_serving_endpoints() -> None:
    """After a start nothing is known of the flows' origin: every flow to a frontend of
    a UDP port whose reply source is not one of its serving endpoints goes (all of them
    for a port with none); TCP ports are never touched."""
    keep = frozenset({"10.42.0.2", "10.42.0.3"})
    got = stale_flows(None, state([dns(**LB), svc("empty", ip="10.43.0.11", ports=UDP),
                                   svc("web", ip="10.43.0.12")],
                                  [udp_eps("10.42.0.2", "10.42.0.3"),
                                   eps("web", [ep("10.42.0.4")])]))
    assert got == [F(None, 30053, keep=keep), F("10.43.0.10", 53, keep=keep), F("10.43.0.11", 53),
                   F("192.0.2.1", 53, keep=keep), F("198.51.100.7", 53, keep=keep)]


def test_renderer_keeps_udp_ports_through_its_revision_cache() -> None:
    """The renderer reuses fragments by (uid, resourceVersion); the UDP record must
    follow the objects all the same."""
    def meta(obj: dict[str, Any], rv: int) -> dict[str, Any]:
        obj["metadata"].update(uid=obj["metadata"]["name"], resourceVersion=str(rv))
        return obj

    r = Renderer(OPTS)
    services = [meta(dns(), 1)]
    r.render(services, [meta(udp_eps("10.42.0.2", "10.42.0.3"), 1)])
    first = dict(r.udp_ports)
    r.render(services, [meta(udp_eps("10.42.0.2", "10.42.0.3"), 1)])
    assert r.udp_ports == first
    r.render(services, [meta(udp_eps("10.42.0.3"), 2)])
    assert stale_flows(first, r.udp_ports) == [F("10.43.0.10", 53, "10.42.0.2")]


@pytest.mark.parametrize(("filt", "entry", "want"), [
    (F("10.43.0.10", 53, "10.42.0.2"), ("10.43.0.10", 53, "10.42.0.2"), True),
    (F("10.43.0.10", 53, "10.42.0.2"), ("10.43.0.10", 53, "10.42.0.3"), False),
    (F("10.43.0.10", 53, "10.42.0.2"), ("10.43.0.11", 53, "10.42.0.2"), False),
    (F("10.43.0.10", 53, "10.42.0.2"), ("10.43.0.10", 54, "10.42.0.2"), False),
    (F(None, 30053, "10.42.0.2"), ("192.0.2.1", 30053, "10.42.0.2"), True),
    (F(None, 30053, "10.42.0.2"), ("192.0.2.1", 30053, "10.42.0.3"), False),
    (F("10.43.0.10", 53), ("10.43.0.10", 53, "10.43.0.10"), True),
    (F("10.43.0.10", 53), ("10.43.0.10", 5353, "10.43.0.10"), False),
    (F("10.43.0.10", 53, keep=frozenset({"10.42.0.2"})), ("10.43.0.10", 53, "10.42.0.2"), False),
    (F("10.43.0.10", 53, keep=frozenset({"10.42.0.2"})), ("10.43.0.10", 53, "10.42.0.9"), True),
    (F("10.43.0.10", 53, keep=frozenset({"10.42.0.2"})), ("10.43.0.10", 53, "10.43.0.10"), True),
])
def test_matches(filt: F, entry: tuple[str, int, str], want: bool) -> None:
    assert matches([filt], *entry) is want


def test_filter_reads_like_conntrack() -> None:
    assert str(F("10.43.0.10", 53, "10.42.0.2")) == \
        "-p udp --orig-dst 10.43.0.10 --orig-port-dst 53 --reply-src 10.42.0.2"
    assert str(F(None, 30053)) == "-p udp --orig-port-dst 30053"
    assert str(F(None, 30053, keep=frozenset({"b", "a"}))) == \
        "-p udp --orig-port-dst 30053 (reply source not a,b)"


async def _noop_apply(text: str, netns: str | None) -> None:
    pass


async def test_sync_deletes_after_apply_and_survives_failures() -> None:
    calls: list[tuple[list[F], str | None]] = []
    fail = False

    def deleter(flows: list[F], netns: str | None) -> int:
        calls.append((flows, netns))
        if fail:
            raise OSError("netlink says no")
        return 3

    rules = ServiceRules(OPTS, netns="/run/netns/x", apply=_noop_apply, plan_in_thread=False,
                         conntrack=deleter)
    res = await rules.sync([dns()], [udp_eps("10.42.0.2", "10.42.0.3")])
    # The first sync reconciles (nothing known of what came before).
    first = [F("10.43.0.10", 53, keep=frozenset({"10.42.0.2", "10.42.0.3"}))]
    assert calls == [(first, "/run/netns/x")] and res.conntrack == first
    res = await rules.sync([dns()], [udp_eps("10.42.0.3")])
    assert calls[1:] == [([F("10.43.0.10", 53, "10.42.0.2")], "/run/netns/x")]
    assert res.conntrack_deleted == 3
    fail = True
    before = CONNTRACK_FAILURES._value.get()
    res = await rules.sync([dns()], [])  # the last one goes; the deleter fails
    assert res.kind == "incremental" and res.conntrack_deleted is None
    assert CONNTRACK_FAILURES._value.get() == before + 1
    # The failure does not replay: the next sync diffs from what was applied.
    fail = False
    res = await rules.sync([dns()], [])
    assert res.conntrack == [] and len(calls) == 3


async def test_failed_transaction_keeps_the_old_state_for_the_next_diff() -> None:
    from fleet.network import nft

    calls: list[list[F]] = []
    broken = False

    async def apply(text: str, netns: str | None) -> None:
        if broken:
            raise nft.NftError("nope")

    rules = ServiceRules(OPTS, apply=apply, plan_in_thread=False,
                         conntrack=lambda flows, netns: calls.append(flows) or 0)
    await rules.sync([dns()], [udp_eps("10.42.0.2", "10.42.0.3")])
    calls.clear()  # the first sync's reconcile
    broken = True
    with pytest.raises(nft.NftError):
        await rules.sync([dns()], [udp_eps("10.42.0.3")])
    assert calls == []
    broken = False
    await rules.sync([dns()], [udp_eps("10.42.0.3")])
    assert calls == [[F("10.43.0.10", 53, "10.42.0.2")]]


def test_a_recording_apply_never_touches_the_kernel_conntrack() -> None:
    assert ServiceRules(OPTS, apply=_noop_apply)._conntrack is None
    assert ServiceRules(OPTS)._conntrack is not None
    assert ServiceRules(OPTS, conntrack=None)._conntrack is None
