"""The service proxy's diff: one rendering to the next in one consistent transaction."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.network.proxy_diff import (
    Op,
    TransactionError,
    apply_ops,
    diff,
    full,
    needs_full,
    script,
    touched,
)
from fleet.network.proxy_rules import (
    Chain,
    ProxyOptions,
    Table,
    render,
)
from tests.unit.network.proxy_objects import ep, eps, svc

OPTS = ProxyOptions(node_name="n1")


def world(endpoints: dict[str, list[str]], **spec: Any) -> Table:
    services = [svc(name, ip=f"10.43.0.{i + 2}", **spec) for i, name in enumerate(sorted(endpoints))]
    slices = [eps(name, [ep(ip, "n1") for ip in ips]) for name, ips in endpoints.items()]
    return render(services, slices, OPTS)


def test_no_change_is_no_op() -> None:
    a = world({"a": ["10.42.0.2"], "b": ["10.42.0.3"]})
    assert diff(a, world({"b": ["10.42.0.3"], "a": ["10.42.0.2"]})) == []
    assert script(a, []) == ""


def test_one_endpoint_change_touches_only_that_service() -> None:
    base = {f"s{i}": [f"10.42.{i}.{j}" for j in range(2, 5)] for i in range(20)}
    a = world(base)
    b = world({**base, "s7": ["10.42.7.2", "10.42.7.3", "10.42.7.99"]})
    ops = diff(a, b)
    names = touched(ops)
    assert names and all("/s7/" in n for n in names), names
    assert {(o.verb, o.what) for o in ops} == {("add", "chain"), ("flush", "chain"),
                                              ("delete", "chain"), ("add", "rule")}
    assert apply_ops(a, ops).normalized() == b.normalized()
    text = script(b, ops)
    assert "s7" in text and "/s6/" not in text and "delete table" not in text


def test_service_going_away_removes_its_elements_and_chains() -> None:
    a = world({"a": ["10.42.0.2"], "b": ["10.42.0.3"]})
    b = world({"a": ["10.42.0.2"]})
    ops = diff(a, b)
    # Elements go before the chains they point at; chains are flushed before deletion.
    kinds = [(o.verb, o.what) for o in ops]
    assert kinds.index(("delete", "element")) < kinds.index(("delete", "chain"))
    assert kinds.index(("flush", "chain")) < kinds.index(("delete", "chain"))
    assert apply_ops(a, ops).normalized() == b.normalized()


def test_last_endpoint_going_moves_the_service_to_reject() -> None:
    a = world({"a": ["10.42.0.2"]})
    b = world({"a": []})
    ops = diff(a, b)
    assert Op("add", "element", "no-endpoint-services", "10.43.0.2 . tcp . 80", "goto reject-chain") in ops
    assert Op("delete", "element", "service-ips", "10.43.0.2 . tcp . 80") in ops
    assert apply_ops(a, ops).normalized() == b.normalized()


def test_affinity_timeout_change_recreates_the_sets_and_their_users() -> None:
    aff = {"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10}}}
    a = world({"a": ["10.42.0.2", "10.42.0.3"]}, **aff)
    aff["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 20}}
    b = world({"a": ["10.42.0.2", "10.42.0.3"]}, **aff)
    ops = diff(a, b)
    assert sum(1 for o in ops if (o.verb, o.what) == ("delete", "set")) == 2
    assert apply_ops(a, ops).normalized() == b.normalized()


def test_full_replaces_the_table_and_builds_from_empty() -> None:
    a = world({"a": ["10.42.0.2"]})
    ops = full(a)
    assert ops[:3] == [Op("add", "table"), Op("delete", "table"), Op("add", "table")]
    stale = Table(a.name, chains={"junk": Chain(("drop",))})
    assert apply_ops(stale, ops).normalized() == a.normalized()
    text = script(a, ops)
    assert text.startswith(f"add table ip {a.name}\ndelete table ip {a.name}\nadd table ip {a.name}\n")
    assert "add chain ip fleet-proxy nat-prerouting { type nat hook prerouting priority -100;" in text


def test_needs_full() -> None:
    a = world({"a": ["10.42.0.2"]})
    assert needs_full(None, a)
    assert not needs_full(a, world({"b": ["10.42.0.2"]}))
    assert needs_full(a, render([], [], ProxyOptions(table="other")))
    assert needs_full(a, render([], [], ProxyOptions(nodeport_addresses="primary")))


def test_script_batches_elements_per_set() -> None:
    a = render([], [], OPTS)
    b = world({"a": ["10.42.0.2"], "b": ["10.42.0.3"]})
    text = script(b, diff(a, b))
    lines = [ln for ln in text.splitlines() if ln.startswith("add element ip fleet-proxy service-ips")]
    ips = b.elements["service-ips"]
    assert lines == ["add element ip fleet-proxy service-ips { "
                     f"10.43.0.2 . tcp . 80 : {ips['10.43.0.2 . tcp . 80']}, "
                     f"10.43.0.3 . tcp . 80 : {ips['10.43.0.3 . tcp . 80']} }}"]


@pytest.mark.parametrize("ops,why", [
    ([Op("delete", "chain", "nat-prerouting")], "not empty"),
    ([Op("flush", "chain", "services"), Op("delete", "chain", "services")], "in use"),
    ([Op("add", "element", "service-ips", "k", "goto nowhere")], "missing"),
    ([Op("delete", "element", "service-ips", "k")], "does not exist"),
    ([Op("add", "rule", "services", "goto nowhere")], "missing"),
    ([Op("delete", "set", "service-ips")], "in use"),
])
def test_the_model_refuses_what_nft_refuses(ops: list[Op], why: str) -> None:
    with pytest.raises(TransactionError, match=why):
        apply_ops(render([], [], OPTS), ops)


# --------------------------------------------------------------------------- property

IPS = [f"10.42.0.{i}" for i in range(2, 8)]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    services, slices = [], []
    for i, name in enumerate(draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=4))):
        kind = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
        spec: dict[str, Any] = {"type": kind}
        if draw(st.booleans()):
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": draw(st.sampled_from([10, 20]))}}
        if kind != "ClusterIP":
            spec["externalTrafficPolicy"] = draw(st.sampled_from(["Cluster", "Local"]))
        spec["internalTrafficPolicy"] = draw(st.sampled_from(["Cluster", "Local"]))
        if draw(st.booleans()):
            spec["externalIPs"] = ["198.51.100.7"]
        port = {"name": "http", "port": 80 + draw(st.integers(0, 1)), "nodePort": 30000 + i}
        if kind == "LoadBalancer":
            spec["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}
        services.append(svc(name, ip=f"10.43.0.{draw(st.integers(2, 5))}", ports=[port], **spec))
        endpoints = [ep(ip, draw(st.sampled_from(["n1", "n2"])), ready=draw(st.sampled_from([True, False, None])),
                        serving=draw(st.sampled_from([True, False, None])),
                        terminating=draw(st.sampled_from([True, False, None])))
                     for ip in draw(st.lists(st.sampled_from(IPS), unique=True, max_size=4))]
        slices.append(eps(name, endpoints, ports=[{"name": "http", "port": draw(st.sampled_from([8080, 8081]))}]))
    return services, slices


@settings(max_examples=300, deadline=None)
@given(worlds(), worlds())
def test_applying_the_diff_gives_the_new_table(wa: Any, wb: Any) -> None:
    a, b = render(*wa, OPTS), render(*wb, OPTS)
    ops = diff(a, b)
    assert apply_ops(a, ops).normalized() == b.normalized()
    assert apply_ops(render([], [], OPTS), full(b)).normalized() == b.normalized()
    assert diff(b, b) == []
    # Nothing unchanged is mentioned: every chain or set an op names differs between a
    # and b, or (a chain) uses a set that is re-created.
    redeclared = {n for n in a.sets.keys() | b.sets.keys() if a.sets.get(n) != b.sets.get(n)}
    for name in touched(ops):
        assert a.chains.get(name) != b.chains.get(name) or a.sets.get(name) != b.sets.get(name) \
            or any(f"@{s} " in r for r in a.chains.get(name, Chain()).rules for s in redeclared)


def test_chains_that_go_are_flushed_now_and_deleted_after_the_grace() -> None:
    from fleet.network.proxy_diff import hold_chain_deletes

    a = world({"a": ["10.42.0.2"], "b": ["10.42.0.3"]})
    b = world({"a": ["10.42.0.2"]})
    ops, applied, held = hold_chain_deletes(diff(a, b), b, {}, now=100.0, grace=1.0)
    assert held and all("/b/" in n for n in held) and set(held.values()) == {100.0}
    assert not [o for o in ops if (o.verb, o.what) == ("delete", "chain")]
    assert [o for o in ops if (o.verb, o.what) == ("flush", "chain")]
    # What the kernel holds afterwards: b plus the empty held chains, consistently.
    assert apply_ops(a, ops).normalized() == applied.normalized()
    # Before the grace: nothing to do; after it: the deletions, and nothing held.
    ops2, applied2, held2 = hold_chain_deletes(diff(applied, b), b, held, now=100.5, grace=1.0)
    assert ops2 == [] and held2 == held
    ops3, applied3, held3 = hold_chain_deletes(diff(applied2, b), b, held2, now=101.0, grace=1.0)
    assert {o.name for o in ops3} == set(held) and held3 == {}
    assert apply_ops(applied2, ops3).normalized() == b.normalized() == applied3.normalized()
    # A held chain the next rendering needs again is simply refilled.
    ops4, _, held4 = hold_chain_deletes(diff(applied, a), a, held, now=100.2, grace=1.0)
    assert held4 == {} and apply_ops(applied, ops4).normalized() == a.normalized()


async def test_service_rules_hold_deletes_until_the_grace(autojump_clock: Any) -> None:
    from fleet.network.service_proxy import ServiceRules

    scripts: list[str] = []

    async def fake_apply(text: str, netns: str | None) -> None:
        scripts.append(text)

    rules = ServiceRules(OPTS, apply=fake_apply, plan_in_thread=False)
    both = ([svc("a", ip="10.43.0.2"), svc("b", ip="10.43.0.3")],
            [eps("a", [ep("10.42.0.2")]), eps("b", [ep("10.42.0.3")])])
    only_a = (both[0][:1], both[1][:1])
    assert (await rules.sync(*both)).kind == "full"
    res = await rules.sync(*only_a)
    assert res.kind == "incremental" and "flush chain" in res.script and "delete chain" not in res.script
    assert rules.next_cleanup() == pytest.approx(1.0)
    assert (await rules.sync(*only_a)).kind == "noop"
    await trio.sleep(1.0)
    assert rules.next_cleanup() == 0.0
    res = await rules.sync(*only_a)
    assert res.kind == "incremental" and res.script.count("delete chain") == 2, res.script
    assert rules.next_cleanup() is None and len(scripts) == 3


def test_node_addresses() -> None:
    from fleet.network.service_proxy import node_addresses

    node = {"status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                     {"type": "InternalIP", "address": "192.0.2.1"},
                                     {"type": "InternalIP", "address": "fd00::1"},
                                     {"type": "ExternalIP", "address": "198.51.100.1"},
                                     "junk"]}}
    assert node_addresses(node) == ("192.0.2.1", "198.51.100.1")
    assert node_addresses(None) == () and node_addresses({"status": "x"}) == ()
