"""NetworkPolicy evaluation (fleet.network.policy), one table row per rule of the semantics.

Every row names the policies in force and a list of checks: (pod, direction, peer
address, protocol, port, expected).  The cluster is fixed (`CLUSTER`) so each row reads
as "with these policies, can this pod talk to that peer".
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.network.policy import (
    Allow,
    PodRules,
    PolicyIndex,
    PolicyView,
    PortRange,
    allowed,
    cut_excepts,
    pod_ips,
    policy_types,
    rules_for,
)
from tests.unit.network.policy_objects import endpoint_slice, namespace, pod, policy, service

NAMESPACES = [namespace("default", team="a"), namespace("other", team="b"),
              namespace("kube-system")]
WEB = pod("web", "default", "10.244.0.10", {"app": "web"},
          ports={"http": 8080, "metrics": (9100, "UDP")})
CLIENT = pod("client", "default", "10.244.0.11", {"app": "client"})
FOREIGN_CLIENT = pod("client", "other", "10.244.1.11", {"app": "client"})
DB = pod("db", "other", "10.244.1.20", {"app": "db"}, ports={"pg": 5432, "http": 8081})
PENDING = pod("pending", "default", None, {"app": "client"})
HOSTNET = pod("hostnet", "default", "192.168.0.5", {"app": "client"}, host_network=True)
DONE = pod("done", "default", "10.244.0.99", {"app": "client"}, phase="Succeeded")
PODS = {"web": WEB, "client": CLIENT, "foreign": FOREIGN_CLIENT, "db": DB, "pending": PENDING,
        "hostnet": HOSTNET, "done": DONE}

DB_SVC = service("db", "other", "10.43.0.50",
                 [{"name": "pg", "port": 5433, "protocol": "TCP", "targetPort": "pg"}],
                 selector={"app": "db"})
DB_SLICE = endpoint_slice("db", "other", [{"name": "pg", "port": 5432, "protocol": "TCP"}],
                          [("10.244.1.20", "db", True)])
DNS_SVC = service("kube-dns", "kube-system", "10.43.0.10",
                  [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 10053},
                   {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 10053}],
                  labels={"k8s-app": "kube-dns"})
DNS_SLICE = endpoint_slice("kube-dns", "kube-system",
                           [{"name": "dns", "port": 10053, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 10053, "protocol": "TCP"}],
                           [("192.168.0.1", None, True)])

WEB_ONLY = {"matchLabels": {"app": "web"}}
CLIENTS = {"podSelector": {"matchLabels": {"app": "client"}}}
TEAM_B = {"namespaceSelector": {"matchLabels": {"team": "b"}}}
DNS_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}

IN, E = "ingress", "egress"
Check = tuple[str, str, str, str, int, bool]

CASES: list[tuple[str, list[dict[str, Any]], list[Check]]] = [
    ("no policy: everything allowed", [], [
        ("web", IN, "1.2.3.4", "TCP", 80, True), ("web", E, "1.2.3.4", "UDP", 53, True)]),
    ("a policy that selects other pods does not isolate", [
        policy("p", "default", {"matchLabels": {"app": "nope"}})], [
        ("web", IN, "10.244.0.11", "TCP", 8080, True)]),
    ("a policy in another namespace does not apply", [
        policy("p", "other", {})], [
        ("web", IN, "10.244.0.11", "TCP", 8080, True), ("db", IN, "10.244.0.11", "TCP", 5432, False)]),
    ("empty ingress: ingress denied, egress (default policyTypes) untouched", [
        policy("deny", "default", WEB_ONLY)], [
        ("web", IN, "10.244.0.11", "TCP", 8080, False), ("web", E, "10.244.1.20", "TCP", 5432, True),
        ("client", IN, "10.244.0.10", "TCP", 80, True)]),
    ("policyTypes Egress only: ingress untouched", [
        policy("deny", "default", WEB_ONLY, types=["Egress"])], [
        ("web", IN, "10.244.0.11", "TCP", 8080, True), ("web", E, "10.244.1.20", "TCP", 5432, False)]),
    ("egress rules without policyTypes isolate both directions", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [TEAM_B]}])], [
        ("web", E, "10.244.1.20", "TCP", 5432, True), ("web", E, "10.244.0.11", "TCP", 80, False),
        ("web", IN, "10.244.0.11", "TCP", 8080, False)]),
    ("podSelector peer: pods of the policy's namespace only", [
        policy("p", "default", WEB_ONLY, ingress=[{"from": [CLIENTS]}])], [
        ("web", IN, "10.244.0.11", "TCP", 8080, True), ("web", IN, "10.244.1.11", "TCP", 8080, False),
        ("web", IN, "10.244.1.20", "TCP", 8080, False)]),
    ("namespaceSelector peer: every pod of matching namespaces", [
        policy("p", "default", WEB_ONLY, ingress=[{"from": [TEAM_B]}])], [
        ("web", IN, "10.244.1.11", "TCP", 1, True), ("web", IN, "10.244.1.20", "UDP", 9, True),
        ("web", IN, "10.244.0.11", "TCP", 8080, False)]),
    ("empty namespaceSelector: every namespace", [
        policy("p", "default", WEB_ONLY, ingress=[{"from": [{"namespaceSelector": {}}]}])], [
        ("web", IN, "10.244.1.11", "TCP", 1, True), ("web", IN, "10.244.0.11", "TCP", 1, True),
        ("web", IN, "8.8.8.8", "TCP", 1, False)]),
    ("both selectors in one peer: matching pods in matching namespaces", [
        policy("p", "default", WEB_ONLY, ingress=[{"from": [{**TEAM_B, **CLIENTS}]}])], [
        ("web", IN, "10.244.1.11", "TCP", 8080, True), ("web", IN, "10.244.1.20", "TCP", 8080, False),
        ("web", IN, "10.244.0.11", "TCP", 8080, False)]),
    ("ipBlock with except", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [{"ipBlock": {
            "cidr": "172.16.0.0/12", "except": ["172.17.0.0/16", "172.18.5.0/24"]}}]}])], [
        ("web", E, "172.16.0.1", "TCP", 443, True), ("web", E, "172.17.3.3", "TCP", 443, False),
        ("web", E, "172.18.5.9", "UDP", 53, False), ("web", E, "172.18.6.9", "UDP", 53, True),
        ("web", E, "10.0.0.1", "TCP", 443, False)]),
    ("numeric ports, protocol defaults to TCP", [
        policy("p", "default", WEB_ONLY, ingress=[{"ports": [{"port": 8080}]}])], [
        ("web", IN, "1.2.3.4", "TCP", 8080, True), ("web", IN, "1.2.3.4", "UDP", 8080, False),
        ("web", IN, "1.2.3.4", "TCP", 8081, False)]),
    ("protocol without port: every port of that protocol", [
        policy("p", "default", WEB_ONLY, ingress=[{"ports": [{"protocol": "SCTP"}]}])], [
        ("web", IN, "1.2.3.4", "SCTP", 1, True), ("web", IN, "1.2.3.4", "SCTP", 65535, True),
        ("web", IN, "1.2.3.4", "TCP", 1, False)]),
    ("endPort range", [
        policy("p", "default", WEB_ONLY, egress=[{"ports": [
            {"port": 32000, "endPort": 32768, "protocol": "UDP"}]}])], [
        ("web", E, "1.2.3.4", "UDP", 32000, True), ("web", E, "1.2.3.4", "UDP", 32768, True),
        ("web", E, "1.2.3.4", "UDP", 32769, False), ("web", E, "1.2.3.4", "TCP", 32100, False)]),
    ("named ingress port: the selected pod's own port", [
        policy("p", "default", WEB_ONLY, ingress=[{"ports": [{"port": "http"},
                                                            {"port": "metrics", "protocol": "UDP"}]}])], [
        ("web", IN, "10.244.1.20", "TCP", 8080, True), ("web", IN, "10.244.1.20", "TCP", 8081, False),
        ("web", IN, "10.244.1.20", "UDP", 9100, True), ("web", IN, "10.244.1.20", "TCP", 9100, False)]),
    ("named egress port: each destination pod's own port", [
        policy("p", "default", WEB_ONLY, egress=[{"ports": [{"port": "http"}]}])], [
        ("web", E, "10.244.1.20", "TCP", 8081, True), ("web", E, "10.244.1.20", "TCP", 8080, False),
        ("web", E, "10.244.0.10", "TCP", 8080, True), ("web", E, "1.2.3.4", "TCP", 8080, False)]),
    ("named egress port limited by the rule's peers", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [{"podSelector": {}}],
                                                  "ports": [{"port": "http"}]}])], [
        ("web", E, "10.244.0.10", "TCP", 8080, True), ("web", E, "10.244.1.20", "TCP", 8081, False)]),
    ("empty from and empty ports: everything", [
        policy("p", "default", WEB_ONLY, ingress=[{}])], [
        ("web", IN, "1.2.3.4", "TCP", 1, True), ("web", IN, "1.2.3.4", "ICMP", 0, True)]),
    ("policies add up", [
        policy("a", "default", WEB_ONLY, ingress=[{"from": [CLIENTS], "ports": [{"port": 80}]}]),
        policy("b", "default", {}, ingress=[{"from": [TEAM_B], "ports": [{"port": 443}]}])], [
        ("web", IN, "10.244.0.11", "TCP", 80, True), ("web", IN, "10.244.1.11", "TCP", 443, True),
        ("web", IN, "10.244.0.11", "TCP", 443, False), ("web", IN, "10.244.1.11", "TCP", 80, False),
        ("client", IN, "10.244.1.11", "TCP", 443, True), ("client", IN, "10.244.0.10", "TCP", 80, False)]),
    ("pods without IPs, host-network and finished pods are no peers", [
        policy("p", "default", WEB_ONLY, ingress=[{"from": [CLIENTS]}])], [
        ("web", IN, "192.168.0.5", "TCP", 8080, False), ("web", IN, "10.244.0.99", "TCP", 8080, False),
        ("web", IN, "10.244.0.11", "TCP", 8080, True)]),
    ("ClusterIP allowed when the rule allows an endpoint (endpoint port)", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [TEAM_B], "ports": [{"port": 5432}]}])], [
        ("web", E, "10.43.0.50", "TCP", 5433, True), ("web", E, "10.244.1.20", "TCP", 5432, True),
        ("web", E, "10.43.0.50", "TCP", 5432, False), ("web", E, "10.43.0.50", "UDP", 5433, False)]),
    ("ClusterIP allowed through a named port of the endpoint pod", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [TEAM_B], "ports": [{"port": "pg"}]}])], [
        ("web", E, "10.43.0.50", "TCP", 5433, True)]),
    ("ClusterIP denied when the rule allows no endpoint", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [CLIENTS]}])], [
        ("web", E, "10.43.0.50", "TCP", 5433, False), ("web", E, "10.244.0.11", "TCP", 5433, True)]),
    ("ClusterIP denied when the rule's port is the Service port, not the endpoint's", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [TEAM_B], "ports": [{"port": 5433}]}])], [
        ("web", E, "10.43.0.50", "TCP", 5433, False)]),
    ("cluster DNS: blocked under egress isolation", [
        policy("p", "default", WEB_ONLY, types=["Egress"])], [
        ("web", E, "10.43.0.10", "UDP", 53, False), ("web", E, "10.43.0.10", "TCP", 53, False)]),
    ("cluster DNS: the usual allow-DNS policy admits it (pseudo-pod)", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [DNS_PEER], "ports": [
            {"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}])], [
        ("web", E, "10.43.0.10", "UDP", 53, True), ("web", E, "10.43.0.10", "TCP", 53, True),
        ("web", E, "10.43.0.50", "TCP", 5433, False), ("web", E, "10.43.0.10", "UDP", 10053, False)]),
    ("cluster DNS: named Service port of the pseudo-pod, protocol must match", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [DNS_PEER], "ports": [
            {"port": "dns", "protocol": "UDP"}]}])], [
        ("web", E, "10.43.0.10", "UDP", 53, True), ("web", E, "10.43.0.10", "TCP", 53, False)]),
    ("cluster DNS: a selector for other labels does not admit it", [
        policy("p", "default", WEB_ONLY, egress=[{"to": [{"namespaceSelector": {}, "podSelector": {
            "matchLabels": {"k8s-app": "other"}}}]}])], [
        ("web", E, "10.43.0.10", "UDP", 53, False)]),
    ("IPv6 peers: evaluated per family, never crash", [
        policy("p", "default", WEB_ONLY, ingress=[{"from": [{"ipBlock": {
            "cidr": "fd00::/64", "except": ["fd00::/120"]}}]}])], [
        ("web", IN, "fd00::1:1", "TCP", 1, True), ("web", IN, "fd00::1", "TCP", 1, False),
        ("web", IN, "10.0.0.1", "TCP", 1, False)]),
]


def view(policies: list[dict[str, Any]]) -> PolicyView:
    return PolicyView(policies=policies, pods=list(PODS.values()), namespaces=NAMESPACES,
                      services=[DB_SVC, DNS_SVC], endpoint_slices=[DB_SLICE, DNS_SLICE])


@pytest.mark.parametrize(("policies", "checks"), [(p, c) for _, p, c in CASES],
                         ids=[name for name, _, _ in CASES])
def test_semantics(policies: list[dict[str, Any]], checks: list[Check]) -> None:
    index = PolicyIndex(view(policies))
    for pod_name, direction, peer, proto, port, expected in checks:
        rules = index.rules_for(PODS[pod_name])
        assert allowed(rules, direction, peer, proto, port) is expected, \
            (pod_name, direction, peer, proto, port, rules)
        # The one-shot function answers the same as the index.
        assert rules_for(PODS[pod_name], view(policies)) == rules


def test_rules_name_the_selecting_policies_and_problems() -> None:
    policies = [policy("b", "default", WEB_ONLY, ingress=[{"ports": [{"port": "nope"}]}]),
                policy("a", "default", {}), policy("c", "default", {"matchLabels": {"app": "x"}}),
                policy("d", "default", {}, egress=[{"to": [{"ipBlock": {"cidr": "bogus"}}]}])]
    rules = rules_for(WEB, view(policies))
    assert rules.policies == ("default/a", "default/b", "default/d")
    assert any("nope" in p for p in rules.problems)
    assert any("bogus" in p for p in rules.problems)
    # The unresolvable named port allows nothing rather than everything.
    assert rules.ingress_isolated and rules.ingress == ()
    # A malformed ipBlock is no peer: the egress rule allows nothing.
    assert rules.egress_isolated and not allowed(rules, "egress", "1.2.3.4", "TCP", 80)


def test_no_policy_gives_default_rules() -> None:
    assert rules_for(WEB, view([])) == PodRules()


def test_egress_elements_are_per_peer_for_named_ports() -> None:
    rules = rules_for(WEB, view([policy("p", "default", WEB_ONLY, egress=[{"ports": [{"port": "http"}]}])]))
    assert Allow(("10.244.1.20/32",), (PortRange("TCP", 8081, 8081),)) in rules.egress
    assert Allow(("10.244.0.10/32",), (PortRange("TCP", 8080, 8080),)) in rules.egress


def test_unready_endpoints_do_not_open_the_cluster_ip() -> None:
    unready = endpoint_slice("db", "other", [{"name": "pg", "port": 5432, "protocol": "TCP"}],
                             [("10.244.1.20", "db", False)])
    pol = policy("p", "default", WEB_ONLY, egress=[{"to": [TEAM_B]}])
    v = PolicyView(policies=[pol], pods=list(PODS.values()), namespaces=NAMESPACES,
                   services=[DB_SVC], endpoint_slices=[unready])
    rules = rules_for(WEB, v)
    assert not allowed(rules, "egress", "10.43.0.50", "TCP", 5433)
    assert allowed(rules, "egress", "10.244.1.20", "TCP", 5432)


def test_namespace_missing_from_the_view_still_matches_by_name() -> None:
    pol = policy("p", "default", WEB_ONLY, ingress=[{"from": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "other"}}}]}])
    v = PolicyView(policies=[pol], pods=list(PODS.values()), namespaces=[])
    assert allowed(rules_for(WEB, v), "ingress", "10.244.1.11", "TCP", 80)


@pytest.mark.parametrize(("spec", "expected"), [
    ({}, (True, False)),
    ({"egress": []}, (True, False)),
    ({"egress": [{}]}, (True, True)),
    ({"policyTypes": ["Egress"]}, (False, True)),
    ({"policyTypes": ["Ingress", "Egress"], "egress": []}, (True, True)),
])
def test_policy_types_defaulting(spec: dict[str, Any], expected: tuple[bool, bool]) -> None:
    assert policy_types({"spec": spec}) == expected


@pytest.mark.parametrize(("cidr", "excepts", "expected"), [
    ("10.0.0.0/24", [], ("10.0.0.0/24",)),
    ("10.0.0.0/24", ["10.0.0.0/25"], ("10.0.0.128/25",)),
    ("10.0.0.0/24", ["10.0.0.0/16"], ()),
    ("10.0.0.0/24", ["10.0.1.0/24", "fd00::/8"], ("10.0.0.0/24",)),
    ("10.0.0.5/24", ["10.0.0.0/26", "10.0.0.64/26"], ("10.0.0.128/25",)),
])
def test_cut_excepts(cidr: str, excepts: list[str], expected: tuple[str, ...]) -> None:
    assert cut_excepts(cidr, excepts) == expected


def test_pod_ips() -> None:
    assert pod_ips(WEB) == ("10.244.0.10",)
    assert pod_ips(PENDING) == pod_ips(HOSTNET) == pod_ips(DONE) == ()
    dual = pod("d", "default", "10.0.0.1")
    dual["status"]["podIPs"].append({"ip": "fd00::1"})
    assert pod_ips(dual) == ("10.0.0.1", "fd00::1")


def test_allowed_rejects_an_unknown_direction() -> None:
    with pytest.raises(ValueError):
        allowed(PodRules(), "sideways", "1.2.3.4", "TCP", 1)  # type: ignore[arg-type]
