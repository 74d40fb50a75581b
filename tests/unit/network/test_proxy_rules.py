"""The service proxy's renderer: Services + EndpointSlices → the fleet-proxy table."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.network.proxy_objects import (
    Endpoint,
    ServicePort,
    categorize,
    service_ports,
    slice_endpoints,
)
from fleet.network.proxy_rules import (
    ProxyOptions,
    affinity_set,
    endpoint_chain,
    external_chain,
    hash_name,
    local_chain,
    render,
    render_text,
    service_chain,
)
from tests.unit.network.proxy_objects import ep, eps, svc

OPTS = ProxyOptions(node_name="n1", node_ips=("192.0.2.1",))


def sp_of(s: dict[str, Any], i: int = 0) -> ServicePort:
    return service_ports(s)[i]


def vmap_targets(rules: tuple[str, ...]) -> list[str]:
    (rule,) = [r for r in rules if r.startswith("numgen")]
    return [part.split("goto ")[1].strip(" }") for part in rule.split("{", 1)[1].split(",")]


# --------------------------------------------------------------------------- names


def test_chain_names_are_stable_hashed_and_readable() -> None:
    sp = sp_of(svc("web"))
    assert service_chain(sp) == service_chain(sp_of(svc("web")))
    assert service_chain(sp).startswith("service-") and service_chain(sp).endswith("-default/web/tcp/http")
    assert len(service_chain(sp).split("-")[1]) == 8
    assert local_chain(sp).startswith("local-") and external_chain(sp).startswith("external-")
    e = Endpoint("10.42.0.5", 8080)
    assert endpoint_chain(sp, e).endswith("default/web/tcp/http__10.42.0.5/8080")
    assert affinity_set(sp, e).startswith("affinity-")
    # Different names hash differently even when they only differ in one digit.
    assert hash_name("a/b/tcp/p1")[:8] != hash_name("a/b/tcp/p2")[:8]
    assert len(hash_name("x" * 400)) == 240 and hash_name("x" * 400).endswith("...")


# --------------------------------------------------------------------------- reading objects


@pytest.mark.parametrize("service,expect", [
    (svc("a", ip="None"), []),
    (svc("a", ip=None), []),
    (svc("a", ip=""), []),
    (svc("a", ip="fd00::1"), []),
    (svc("a", type="ExternalName", externalName="x.example"), []),
    (svc("a", ports=[{"port": 80, "protocol": "ICMP"}, {"port": 70000}, {"port": "80"}]), []),
    (svc("a", ports=[{"port": 53, "protocol": "UDP", "name": "dns"}]), [("dns", "udp", 53, 0)]),
    (svc("a", ports=[{"port": 80, "nodePort": 30080}]), [("", "tcp", 80, 0)]),  # ClusterIP: no nodePort
    (svc("a", type="NodePort", ports=[{"port": 80, "nodePort": 30080}]), [("", "tcp", 80, 30080)]),
    ({"metadata": {"name": "x"}, "spec": "garbage"}, []),
    ({"metadata": {"name": "x"}, "spec": {"clusterIP": "10.43.0.1", "ports": "garbage"}}, []),
    ({"metadata": {"name": "x y"}, "spec": {"clusterIP": "10.43.0.1", "ports": [{"port": 80}]}}, []),
    (svc("a", ports=[{"port": 80, "name": "a b"}, {"port": 81, "name": ["x"]}, {"port": 82, "name": "ok"}]),
     [("ok", "tcp", 82, 0)]),
])
def test_service_ports(service: dict[str, Any], expect: list[tuple[str, str, int, int]]) -> None:
    assert [(p.port_name, p.protocol, p.port, p.node_port) for p in service_ports(service)] == expect


def test_service_port_details() -> None:
    s = svc("lb", type="LoadBalancer", externalIPs=["198.51.100.7", "bogus"],
            ports=[{"port": 80, "nodePort": 30080}], externalTrafficPolicy="Local",
            sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
            status={"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "x"}]}})
    sp = sp_of(s)
    assert sp.external_ips == ("198.51.100.7",) and sp.lb_ips == ("192.0.2.1",)
    assert sp.external_local and not sp.internal_local and sp.affinity_timeout == 60
    assert sp_of(svc("a", sessionAffinity="ClientIP")).affinity_timeout == 10800
    # externalTrafficPolicy Local means nothing without an external address.
    assert not sp_of(svc("a", externalTrafficPolicy="Local")).external_local


@pytest.mark.parametrize("slice_ports,port_name,protocol,expect", [
    ([{"name": "http", "port": 8080}], "http", "tcp", 8080),
    ([{"name": "http", "port": 8080, "protocol": "UDP"}], "http", "tcp", None),
    ([{"name": "other", "port": 9090}, {"name": "http", "port": 8080}], "http", "tcp", 8080),
    ([{"port": 8080}], "", "tcp", 8080),
    ([{"name": "http", "port": 8080}], "", "tcp", None),
    ([{"name": "http"}], "http", "tcp", None),  # no port: nothing to DNAT to
])
def test_slice_port_resolution_by_name(slice_ports: list[dict[str, Any]], port_name: str,
                                       protocol: str, expect: int | None) -> None:
    got = slice_endpoints(eps("a", [ep("10.42.0.2")], ports=slice_ports), port_name, protocol)
    assert [e.port for e in got] == ([expect] if expect else [])


def test_slice_endpoint_conditions_and_bad_addresses() -> None:
    s = eps("a", [ep("10.42.0.2", ready=None), ep("10.42.0.3", ready=False),
                  ep("10.42.0.4", ready=False, serving=True, terminating=True),
                  {"addresses": ["not-an-ip"]}, {"addresses": []}, {"conditions": {}}, "junk"])
    got = slice_endpoints(s, "http", "tcp")
    assert [(e.ip, e.ready, e.serving, e.terminating) for e in got] == [
        ("10.42.0.2", True, True, False), ("10.42.0.3", False, False, False),
        ("10.42.0.4", False, True, True)]
    assert slice_endpoints(eps("a", [ep("fd00::2")], address_type="IPv6"), "http", "tcp") == []


E = Endpoint


@pytest.mark.parametrize("endpoints,cluster,local,has_any", [
    ([], [], [], False),
    ([E("1.0.0.1", 80, "n1"), E("1.0.0.2", 80, "n2")], ["1.0.0.1", "1.0.0.2"], ["1.0.0.1"], True),
    ([E("1.0.0.1", 80, "n2")], ["1.0.0.1"], [], True),
    # not ready, not terminating: never used
    ([E("1.0.0.1", 80, "n1", ready=False, serving=False)], [], [], False),
    # only serving+terminating: the fallback
    ([E("1.0.0.1", 80, "n1", ready=False, serving=True, terminating=True)], ["1.0.0.1"], ["1.0.0.1"], True),
    # a ready one anywhere wins over the fallback, per policy
    ([E("1.0.0.1", 80, "n1", ready=False, serving=True, terminating=True), E("1.0.0.2", 80, "n2")],
     ["1.0.0.2"], ["1.0.0.1"], True),
    # terminating but not serving: not even a fallback
    ([E("1.0.0.1", 80, "n1", ready=False, serving=False, terminating=True)], [], [], False),
])
def test_categorize(endpoints: list[Endpoint], cluster: list[str], local: list[str], has_any: bool) -> None:
    c = categorize(endpoints, "n1")
    assert [e.ip for e in c.cluster] == cluster
    assert [e.ip for e in c.local] == local
    assert c.has_any is has_any


# --------------------------------------------------------------------------- rendering


def test_cluster_ip_with_two_endpoints() -> None:
    s = svc("web", ip="10.43.0.10")
    t = render([s], [eps("web", [ep("10.42.0.3", "n1"), ep("10.42.0.2", "n2"), ep("10.42.0.9", ready=False)])],
               OPTS)
    sp = sp_of(s)
    assert t.elements["service-ips"] == {"10.43.0.10 . tcp . 80": f"goto {service_chain(sp)}"}
    assert t.elements["no-endpoint-services"] == {}
    assert t.elements["cluster-ips"] == {"10.43.0.10": ""}
    rules = t.chains[service_chain(sp)].rules
    # Off-cluster clients are masqueraded, then one of the ready endpoints at random.
    assert rules[0] == ("ip daddr 10.43.0.10 tcp dport 80 ip saddr != 10.42.0.0/16 "
                        "jump mark-for-masquerade")
    assert vmap_targets(rules) == [endpoint_chain(sp, E("10.42.0.2", 8080)),
                                   endpoint_chain(sp, E("10.42.0.3", 8080))]
    assert "numgen random mod 2 vmap" in rules[1]
    assert t.chains[endpoint_chain(sp, E("10.42.0.2", 8080))].rules == (
        "ip saddr 10.42.0.2 jump mark-for-masquerade",  # hairpin
        "meta l4proto tcp dnat to 10.42.0.2:8080")
    assert not any("10.42.0.9" in c for c in t.chains)  # not ready
    assert external_chain(sp) not in t.chains and local_chain(sp) not in t.chains


def test_no_endpoints_rejects_and_has_no_chains() -> None:
    s = svc("web", type="NodePort", ports=[{"name": "http", "port": 80, "nodePort": 30080}],
            externalIPs=["198.51.100.7"])
    t = render([s], [eps("web", [ep("10.42.0.9", ready=False)])], OPTS)
    assert t.elements["service-ips"] == {} and t.elements["service-nodeports"] == {}
    assert t.elements["no-endpoint-services"] == {"10.43.0.10 . tcp . 80": "goto reject-chain",
                                                  "198.51.100.7 . tcp . 80": "goto reject-chain"}
    assert t.elements["no-endpoint-nodeports"] == {"tcp . 30080": "goto reject-chain"}
    assert not [c for c in t.chains if "/" in c]
    assert t.chains["reject-chain"].rules == ("meta l4proto tcp reject with tcp reset", "reject")


def test_nodeport_cluster_policy_masquerades() -> None:
    s = svc("web", type="NodePort", ports=[{"name": "http", "port": 80, "nodePort": 30080}])
    t = render([s], [eps("web", [ep("10.42.0.2", "n2")])], OPTS)
    sp = sp_of(s)
    assert t.elements["service-nodeports"] == {"tcp . 30080": f"goto {external_chain(sp)}"}
    assert t.chains[external_chain(sp)].rules == ("jump mark-for-masquerade",
                                                  f"goto {service_chain(sp)}")
    assert "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports" \
        in t.chains["services"].rules


def test_nodeport_on_primary_addresses_only() -> None:
    s = svc("web", type="NodePort", ports=[{"name": "http", "port": 80, "nodePort": 30080}])
    opts = ProxyOptions(node_name="n1", node_ips=("192.0.2.1",), nodeport_addresses="primary")
    t = render([s], [eps("web", [ep("10.42.0.2")])], opts)
    assert t.elements["nodeport-ips"] == {"192.0.2.1": ""}
    assert "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports" in t.chains["services"].rules


@pytest.mark.parametrize("local_here", [True, False])
def test_external_traffic_policy_local(local_here: bool) -> None:
    s = svc("web", type="NodePort", ports=[{"name": "http", "port": 80, "nodePort": 30080}],
            externalTrafficPolicy="Local")
    endpoints = [ep("10.42.0.2", "n2")] + ([ep("10.42.0.3", "n1")] if local_here else [])
    t = render([s], [eps("web", endpoints)], OPTS)
    sp = sp_of(s)
    ext = t.chains[external_chain(sp)].rules
    # Pods and the node itself short-circuit to the Cluster chain; the rest keeps its
    # source address (no masquerade) and goes to local endpoints only.
    assert ext[:3] == (f"ip saddr 10.42.0.0/16 goto {service_chain(sp)}",
                       "fib saddr type local jump mark-for-masquerade",
                       f"fib saddr type local goto {service_chain(sp)}")
    assert "jump mark-for-masquerade" not in ext
    # The ClusterIP still uses every endpoint.
    assert len(vmap_targets(t.chains[service_chain(sp)].rules)) == len(endpoints)
    if local_here:
        assert ext[3] == f"goto {local_chain(sp)}"
        assert vmap_targets(t.chains[local_chain(sp)].rules) == [endpoint_chain(sp, E("10.42.0.3", 8080))]
        assert t.elements["no-endpoint-nodeports"] == {}
    else:
        assert len(ext) == 3 and local_chain(sp) not in t.chains
        assert t.elements["no-endpoint-nodeports"] == {"tcp . 30080": "drop"}
    assert t.elements["service-nodeports"] == {"tcp . 30080": f"goto {external_chain(sp)}"}


@pytest.mark.parametrize("local_here", [True, False])
def test_internal_traffic_policy_local(local_here: bool) -> None:
    s = svc("web", internalTrafficPolicy="Local")
    endpoints = [ep("10.42.0.2", "n2")] + ([ep("10.42.0.3", "n1")] if local_here else [])
    t = render([s], [eps("web", endpoints)], OPTS)
    sp = sp_of(s)
    assert service_chain(sp) not in t.chains
    if local_here:
        assert t.elements["service-ips"] == {"10.43.0.10 . tcp . 80": f"goto {local_chain(sp)}"}
        assert vmap_targets(t.chains[local_chain(sp)].rules) == [endpoint_chain(sp, E("10.42.0.3", 8080))]
    else:
        assert t.elements["service-ips"] == {}
        assert t.elements["no-endpoint-services"] == {"10.43.0.10 . tcp . 80": "drop"}


def test_session_affinity_sets_and_rules() -> None:
    s = svc("web", sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 30}})
    t = render([s], [eps("web", [ep("10.42.0.2"), ep("10.42.0.3")])], OPTS)
    sp = sp_of(s)
    a, b = E("10.42.0.2", 8080), E("10.42.0.3", 8080)
    rules = t.chains[service_chain(sp)].rules
    assert rules[1:3] == (f"ip saddr @{affinity_set(sp, a)} goto {endpoint_chain(sp, a)}",
                          f"ip saddr @{affinity_set(sp, b)} goto {endpoint_chain(sp, b)}")
    assert rules[3].startswith("numgen random mod 2")
    assert t.sets[affinity_set(sp, a)].body == "type ipv4_addr; flags dynamic,timeout; timeout 30s;"
    assert f"update @{affinity_set(sp, a)} {{ ip saddr }}" in t.chains[endpoint_chain(sp, a)].rules


def test_load_balancer_ingress_and_external_ips_go_to_the_external_chain() -> None:
    s = svc("lb", type="LoadBalancer", externalIPs=["198.51.100.7"],
            ports=[{"port": 443, "nodePort": 30443}],
            status={"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}})
    t = render([s], [eps("lb", [ep("10.42.0.2")], ports=[{"port": 8443}])], OPTS)
    sp = sp_of(s)
    assert t.elements["service-ips"] == {
        "10.43.0.10 . tcp . 443": f"goto {service_chain(sp)}",
        "198.51.100.7 . tcp . 443": f"goto {external_chain(sp)}",
        "192.0.2.1 . tcp . 443": f"goto {external_chain(sp)}"}


def test_endpoints_from_several_slices_are_merged_and_deduplicated() -> None:
    s = svc("web")
    t = render([s], [eps("web", [ep("10.42.0.2"), ep("10.42.0.3")], name="web-a"),
                     eps("web", [ep("10.42.0.3"), ep("10.42.0.4")], name="web-b"),
                     eps("other", [ep("10.42.0.99")])], OPTS)
    assert len(vmap_targets(t.chains[service_chain(sp_of(s))].rules)) == 3


def test_clashing_services_keep_the_first_and_never_break_the_table() -> None:
    a, b = svc("a", ip="10.43.0.10"), svc("b", ip="10.43.0.10")
    t = render([b, a], [eps("a", [ep("10.42.0.2")]), eps("b", [ep("10.42.0.3")])], OPTS)
    assert t.elements["service-ips"] == {"10.43.0.10 . tcp . 80": f"goto {service_chain(sp_of(a))}"}


def test_multiple_ports_and_protocols() -> None:
    s = svc("dns", ip="10.43.0.10", ports=[{"name": "dns", "port": 53, "protocol": "UDP"},
                                           {"name": "dns-tcp", "port": 53, "protocol": "TCP"}])
    slice_ = eps("dns", [ep("10.42.0.2")], ports=[{"name": "dns", "port": 5353, "protocol": "UDP"},
                                                  {"name": "dns-tcp", "port": 5354, "protocol": "TCP"}])
    t = render([s], [slice_], OPTS)
    assert set(t.elements["service-ips"]) == {"10.43.0.10 . udp . 53", "10.43.0.10 . tcp . 53"}
    ep_rules = [c.rules[-1] for n, c in t.chains.items() if n.startswith("endpoint-")]
    assert sorted(ep_rules) == ["meta l4proto tcp dnat to 10.42.0.2:5354",
                                "meta l4proto udp dnat to 10.42.0.2:5353"]


def test_masquerade_all_and_no_cluster_cidr() -> None:
    s = svc("web")
    sl = [eps("web", [ep("10.42.0.2")])]
    t = render([s], sl, ProxyOptions(masquerade_all=True))
    assert t.chains[service_chain(sp_of(s))].rules[0] == \
        "ip daddr 10.43.0.10 tcp dport 80 jump mark-for-masquerade"
    t = render([s], sl, ProxyOptions(cluster_cidr=None, service_cidr=None))
    assert t.chains[service_chain(sp_of(s))].rules[0].startswith("numgen")
    assert t.chains["cluster-ips-check"].rules == ("ip daddr @cluster-ips reject",)


def test_rendering_is_deterministic_and_order_independent() -> None:
    services = [svc(f"s{i}", ip=f"10.43.0.{i + 2}") for i in range(5)]
    slices = [eps(f"s{i}", [ep(f"10.42.0.{i * 3 + j + 2}") for j in range(3)]) for i in range(5)]
    a = render(services, slices, OPTS)
    b = render(list(reversed(services)), list(reversed(slices)), OPTS)
    assert a == b and render_text(a) == render_text(b)
    assert a.rule_count() > 0


def test_base_chains_and_table_name() -> None:
    t = render([], [], ProxyOptions(table="fleet-proxy_fd0"))
    assert t.name == "fleet-proxy_fd0"
    hooks = {n: c.hook for n, c in t.chains.items() if c.hook}
    assert hooks["nat-prerouting"] == "type nat hook prerouting priority -100; policy accept;"
    assert hooks["nat-postrouting"] == "type nat hook postrouting priority 100; policy accept;"
    assert hooks["filter-forward"] == "type filter hook forward priority -110; policy accept;"
    assert t.chains["masquerading"].rules == ("meta mark & 0x4000 == 0 return",
                                              "meta mark set meta mark ^ 0x4000",
                                              "masquerade fully-random")


def test_the_renderer_reuses_unchanged_services_and_matches_render() -> None:
    from fleet.network.proxy_rules import Renderer

    def world(last: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        services = [svc(f"s{i}", ip=f"10.43.0.{i + 2}") for i in range(4)]
        slices = [eps(f"s{i}", [ep(f"10.42.0.{i + 2}"), ep(last if i == 3 else f"10.42.1.{i + 2}")])
                  for i in range(4)]
        for i, s in enumerate(slices):  # API objects: identity and revision
            s["metadata"].update(uid=f"u{i}", resourceVersion="9" if i == 3 and last != "10.42.1.5" else "1")
        return services, slices

    r = Renderer(OPTS)
    first = r.render(*world("10.42.1.5"))
    second = r.render(*world("10.42.9.9"))
    assert first == render(*world("10.42.1.5"), OPTS)
    assert second == render(*world("10.42.9.9"), OPTS)
    # Unchanged services' chains are the very same objects (cheap to compare).
    s0 = service_chain(sp_of(svc("s0", ip="10.43.0.2")))
    assert first.chains[s0] is second.chains[s0]
    s3 = service_chain(sp_of(svc("s3", ip="10.43.0.5")))
    assert first.chains[s3] != second.chains[s3]


_json = st.recursive(st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=12)
                     | st.sampled_from(["10.43.0.1", "None", "TCP", "UDP", "IPv4", "ClientIP", "Local",
                                        "NodePort", "LoadBalancer", "http", "10.42.0.2"]),
                     lambda children: st.lists(children, max_size=3)
                     | st.dictionaries(st.sampled_from(
                         ["metadata", "spec", "status", "name", "namespace", "labels", "clusterIP",
                          "ports", "port", "protocol", "nodePort", "type", "addresses", "endpoints",
                          "addressType", "conditions", "ready", "externalIPs", "loadBalancer",
                          "ingress", "ip", "sessionAffinityConfig", "clientIP", "timeoutSeconds"]),
                         children, max_size=4), max_leaves=20)


_objects = st.dictionaries(st.sampled_from(["metadata", "spec", "status", "endpoints", "ports",
                                           "addressType"]), _json, max_size=5)


@settings(max_examples=400, deadline=None)
@given(st.lists(_objects, max_size=3), st.lists(_objects, max_size=3))
def test_garbage_never_breaks_rendering(services: list[Any], slices: list[Any]) -> None:
    """No object — however malformed below its top level — stops the node's rules."""
    t = render([*services, svc("ok", ip="10.43.0.99")],
               [*slices, eps("ok", [ep("10.42.0.2")])], OPTS)
    assert t.elements["service-ips"].get("10.43.0.99 . tcp . 80", "").startswith("goto service-")
    ident = re.compile(r"[A-Za-z_.][A-Za-z0-9/\-_.]*")
    assert all(ident.fullmatch(n) for n in [*t.chains, *t.sets]), [*t.chains, *t.sets]
