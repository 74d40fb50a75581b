"""Property test: the NetworkPolicy engine agrees with a straightforward reading of the
Kubernetes semantics, for random namespaces, pods and policies, in both directions.

`oracle_allows` below is written from the API reference's wording, independently of
fleet.network.policy: it never builds CIDR lists or port ranges, it asks each policy
directly "does this rule admit this (peer, protocol, port)" for one pair of endpoints.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.network.policy import PolicyIndex, PolicyView, allowed
from tests.unit.network.policy_objects import endpoint_slice, namespace, pod, policy, service

KEYS = ("a", "b")
VALUES = ("x", "y")
PORT_NAMES = ("http", "dns")
PORTS = (53, 80, 81, 8080)
PROTOCOLS = ("TCP", "UDP")
EXTERNAL = "192.0.2.7"  # an address no pod has

labels_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)


@st.composite
def selectors(draw: st.DrawFn) -> dict[str, Any]:
    sel: dict[str, Any] = {}
    if draw(st.booleans()):
        sel["matchLabels"] = draw(labels_st)
    if draw(st.booleans()):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        expr: dict[str, Any] = {"key": draw(st.sampled_from(KEYS)), "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True))
        sel["matchExpressions"] = [expr]
    return sel


@st.composite
def peers(draw: st.DrawFn, ip_blocks: bool = True) -> dict[str, Any]:
    kind = draw(st.sampled_from(["pod", "ns", "both", "ipBlock"] if ip_blocks else ["pod", "ns", "both"]))
    if kind == "ipBlock":
        cidr = draw(st.sampled_from(["10.0.0.0/8", "10.0.0.0/24", "10.0.1.0/24", "0.0.0.0/0",
                                     "192.0.2.0/24", "fd00::/8"]))
        net = ipaddress.ip_network(cidr)
        subnets = [str(s) for s in (net.subnets(new_prefix=min(net.prefixlen + 2, 30))
                                    if net.version == 4 and net.prefixlen < 28 else [])][:4]
        excepts = draw(st.lists(st.sampled_from(subnets), max_size=2, unique=True)) if subnets else []
        block: dict[str, Any] = {"cidr": cidr}
        if excepts:
            block["except"] = excepts
        return {"ipBlock": block}
    out: dict[str, Any] = {}
    if kind in ("pod", "both"):
        out["podSelector"] = draw(selectors())
    if kind in ("ns", "both"):
        out["namespaceSelector"] = draw(selectors())
    return out


@st.composite
def port_specs(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["protocol"] = draw(st.sampled_from(PROTOCOLS))
    kind = draw(st.sampled_from(["number", "range", "name", "none"]))
    if kind == "number":
        out["port"] = draw(st.sampled_from(PORTS))
    elif kind == "range":
        out["port"] = draw(st.sampled_from(PORTS))
        out["endPort"] = out["port"] + draw(st.integers(0, 30))
    elif kind == "name":
        out["port"] = draw(st.sampled_from(PORT_NAMES))
    return out


@st.composite
def rules(draw: st.DrawFn, peer_key: str, pods_only: bool = False) -> dict[str, Any]:
    """A rule; `pods_only`: peers by selectors and explicit ports, so that only pods (and
    through them Services) can ever be admitted."""
    rule: dict[str, Any] = {}
    if pods_only or draw(st.booleans()):
        rule[peer_key] = draw(st.lists(peers(ip_blocks=not pods_only), max_size=3,
                                       min_size=int(pods_only)))
    if pods_only or draw(st.booleans()):
        rule["ports"] = draw(st.lists(port_specs(), max_size=3, min_size=int(pods_only)))
    return rule


@st.composite
def worlds(draw: st.DrawFn, egress_heavy: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    ns_names = ["n0", "n1", "n2"]
    namespaces = [namespace(n, **draw(labels_st)) for n in ns_names]
    pods = []
    for i in range(draw(st.integers(2, 5))):
        ports = draw(st.dictionaries(st.sampled_from(PORT_NAMES),
                                     st.tuples(st.sampled_from(PORTS), st.sampled_from(PROTOCOLS)),
                                     max_size=2))
        ip = f"10.0.{i % 2}.{10 + i}" if draw(st.integers(0, 5)) else None
        pods.append(pod(f"p{i}", draw(st.sampled_from(ns_names)), ip, draw(labels_st), ports=ports))
    policies = []
    for i in range(draw(st.integers(int(egress_heavy), 4))):
        if egress_heavy:  # egress-isolating, pods-only rules, selecting widely
            policies.append(policy(f"np{i}", draw(st.sampled_from(ns_names)),
                                   draw(st.just({}) | selectors()), types=["Egress"],
                                   egress=draw(st.lists(rules("to", pods_only=True), max_size=2))))
            continue
        types = draw(st.sampled_from([None, ["Ingress"], ["Egress"], ["Ingress", "Egress"]]))
        ingress = draw(st.none() | st.lists(rules("from"), max_size=2))
        egress = draw(st.none() | st.lists(rules("to"), max_size=2))
        policies.append(policy(f"np{i}", draw(st.sampled_from(ns_names)), draw(selectors()),
                               ingress=ingress, egress=egress, types=types))
    return namespaces, pods, policies


@st.composite
def services_for(draw: st.DrawFn, pods: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Up to two Services of random namespaces and selectors, each with an EndpointSlice of
    the selected pods that have an address (ready or not), port 7000+i → a pod port."""
    services, slices = [], []
    for i in range(draw(st.integers(0, 2))):
        # Biased towards Services that have endpoints: the namespace of some pod, and
        # often the empty selector (every pod of the namespace).
        ns = draw(st.sampled_from(pods))["metadata"]["namespace"]
        selector = draw(st.just({}) | labels_st)
        proto, target = draw(st.sampled_from(PROTOCOLS)), draw(st.sampled_from(PORTS))
        services.append(service(f"s{i}", ns, f"10.96.0.{i + 1}",
                                [{"name": "p", "port": 7000 + i, "protocol": proto, "targetPort": target}],
                                selector=selector))
        members = [(q["status"]["podIP"], q["metadata"]["name"], draw(st.booleans())) for q in pods
                   if q["metadata"]["namespace"] == ns and q["status"].get("podIP")
                   and all(q["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        slices.append(endpoint_slice(f"s{i}", ns, [{"name": "p", "port": target, "protocol": proto}], members))
    return services, slices


# ----------------------------------------------------------------------------------------
# The oracle: the API reference, read literally, one pair of endpoints at a time.


def sel_matches(sel: dict[str, Any], labels: dict[str, str]) -> bool:
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        op = e["operator"]
        if op == "In" and not (present and value in e["values"]):
            return False
        if op == "NotIn" and present and value in e["values"]:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


class Endpoint:
    """One end of a connection: a pod (namespace, labels, ports) or a bare address."""

    def __init__(self, ip: str, obj: dict[str, Any] | None = None) -> None:
        self.ip = ip
        self.pod = obj

    def named_port(self, name: str, protocol: str) -> int | None:
        if self.pod is None:
            return None
        for c in self.pod["spec"]["containers"]:
            for p in c.get("ports", []):
                if p["name"] == name and p.get("protocol", "TCP") == protocol:
                    return int(p["containerPort"])
        return None


def peer_admits(peer: dict[str, Any], policy_ns: str, other: Endpoint,
                ns_labels: dict[str, dict[str, str]]) -> bool:
    if "ipBlock" in peer:
        addr = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        inside = lambda c: addr.version == ipaddress.ip_network(c).version and addr in ipaddress.ip_network(c)  # noqa: E731
        return inside(block["cidr"]) and not any(inside(c) for c in block.get("except", []))
    if other.pod is None:
        return False  # selectors only ever select pods
    pod_ns = other.pod["metadata"]["namespace"]
    if "namespaceSelector" in peer:
        if not sel_matches(peer["namespaceSelector"], ns_labels[pod_ns]):
            return False
    elif pod_ns != policy_ns:
        return False
    return "podSelector" not in peer or sel_matches(peer["podSelector"], other.pod["metadata"]["labels"])


def port_admits(spec: dict[str, Any], protocol: str, port: int, listener: Endpoint) -> bool:
    if spec.get("protocol", "TCP") != protocol:
        return False
    if "port" not in spec:
        return True
    if isinstance(spec["port"], str):
        return listener.named_port(spec["port"], protocol) == port
    return spec["port"] <= port <= spec.get("endPort", spec["port"])


def oracle_allows(policies: list[dict[str, Any]], ns_labels: dict[str, dict[str, str]],
                  subject: dict[str, Any], direction: str, other: Endpoint,
                  protocol: str, port: int) -> bool:
    """May `subject` receive from (ingress) / send to (egress) `other` on protocol/port?"""
    kind = "Ingress" if direction == "ingress" else "Egress"
    rule_key, peer_key = ("ingress", "from") if direction == "ingress" else ("egress", "to")
    selecting = []
    for p in policies:
        spec = p["spec"]
        types = spec.get("policyTypes") or (["Ingress", "Egress"] if spec.get("egress") else ["Ingress"])
        if (p["metadata"]["namespace"] == subject["metadata"]["namespace"]
                and sel_matches(spec["podSelector"], subject["metadata"]["labels"]) and kind in types):
            selecting.append(p)
    if not selecting:
        return True
    # The named port belongs to whoever listens: the subject for ingress, the peer for egress.
    listener = Endpoint("", subject) if direction == "ingress" else other
    for p in selecting:
        for rule in p["spec"].get(rule_key) or []:
            peer_ok = not rule.get(peer_key) or any(
                peer_admits(x, p["metadata"]["namespace"], other, ns_labels) for x in rule[peer_key])
            port_ok = not rule.get("ports") or any(
                port_admits(s, protocol, port, listener) for s in rule["ports"])
            if peer_ok and port_ok:
                return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_engine_agrees_with_the_oracle(world: Any) -> None:
    namespaces, pods, policies = world
    ns_labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in namespaces}
    index = PolicyIndex(PolicyView(policies=policies, pods=pods, namespaces=namespaces))
    others = [Endpoint(p["status"]["podIP"], p) for p in pods if p["status"].get("podIP")]
    others.append(Endpoint(EXTERNAL))
    for subject in pods:
        rules = index.rules_for(subject)
        for other in others:
            for protocol in PROTOCOLS:
                for port in (*PORTS, 95, 110):
                    for direction in ("ingress", "egress"):
                        expected = oracle_allows(policies, ns_labels, subject, direction, other,
                                                 protocol, port)
                        got = allowed(rules, direction, other.ip, protocol, port)  # type: ignore[arg-type]
                        assert got is expected, (subject["metadata"], direction, other.ip,
                                                 protocol, port, rules)


def oracle_cluster_ip(policies: list[dict[str, Any]], ns_labels: dict[str, dict[str, str]],
                      subject: dict[str, Any], pods: list[dict[str, Any]], svc: dict[str, Any],
                      slice_: dict[str, Any], protocol: str) -> bool:
    """Egress to a Service's ClusterIP:port: allowed as a plain address (non-isolated, or
    an ipBlock/any-destination rule covering it), or — for the Service's protocol — when
    some rule admits a ready endpoint at the endpoint's own port."""
    cip, sport = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]
    if oracle_allows(policies, ns_labels, subject, "egress", Endpoint(cip), protocol, sport):
        return True
    if protocol != svc["spec"]["ports"][0]["protocol"]:
        return False
    by_name = {q["metadata"]["name"]: q for q in pods}
    return any(oracle_allows(policies, ns_labels, subject, "egress",
                             Endpoint(e["addresses"][0], by_name[e["targetRef"]["name"]]),
                             protocol, slice_["ports"][0]["port"])
               for e in slice_["endpoints"] if e["conditions"]["ready"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_cluster_ips_follow_their_endpoints(data: st.DataObject) -> None:
    # Egress-isolating policies with rules: the ClusterIP question is only interesting there.
    namespaces, pods, policies = data.draw(worlds(egress_heavy=True))
    services, slices = data.draw(services_for(pods))
    ns_labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in namespaces}
    index = PolicyIndex(PolicyView(policies=policies, pods=pods, namespaces=namespaces,
                                   services=services, endpoint_slices=slices))
    for subject in pods:
        rules = index.rules_for(subject)
        for svc, slice_ in zip(services, slices, strict=True):
            cip, sport = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]
            for protocol in PROTOCOLS:
                expected = oracle_cluster_ip(policies, ns_labels, subject, pods, svc, slice_, protocol)
                assert allowed(rules, "egress", cip, protocol, sport) is expected, \
                    (subject["metadata"], cip, protocol, rules)
