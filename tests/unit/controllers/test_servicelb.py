"""ServiceLB's pure decision: which ingress a Service gets from which nodes."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.controllers.servicelb import desired_ingress, node_address, plan


def node(name: str, *, internal: str | None = None, external: str | None = None, ready: bool = True,
         labels: dict[str, str] | None = None, deleting: bool = False) -> dict[str, Any]:
    addrs = [{"type": "Hostname", "address": name}]
    if internal:
        addrs.append({"type": "InternalIP", "address": internal})
    if external:
        addrs.append({"type": "ExternalIP", "address": external})
    md: dict[str, Any] = {"name": name, "labels": labels or {}}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "status": {"addresses": addrs,
                                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def svc(type_: str = "LoadBalancer", *, ingress: list[str] | None = None, cls: str | None = None):
    spec: dict[str, Any] = {"type": type_}
    if cls:
        spec["loadBalancerClass"] = cls
    status: dict[str, Any] = {}
    if ingress is not None:
        status["loadBalancer"] = {"ingress": [{"ip": i, "ipMode": "VIP"} for i in ingress]}
    return {"metadata": {"name": "s", "namespace": "default"}, "spec": spec, "status": status}


def ips(ingress):
    return None if ingress is None else [i["ip"] for i in ingress]


@pytest.mark.parametrize(("name", "service", "nodes", "want"), [
    ("internal ips of ready nodes, sorted", svc(),
     [node("b", internal="10.0.0.12"), node("a", internal="10.0.0.9")], ["10.0.0.9", "10.0.0.12"]),
    ("external ip wins", svc(), [node("a", internal="10.0.0.9", external="203.0.113.5")], ["203.0.113.5"]),
    ("not ready and deleting nodes are out", svc(),
     [node("a", internal="10.0.0.1", ready=False), node("b", internal="10.0.0.2", deleting=True),
      node("c", internal="10.0.0.3")], ["10.0.0.3"]),
    ("no nodes: pending", svc(), [], []),
    ("enablelb label selects nodes", svc(),
     [node("a", internal="10.0.0.1", labels={"svccontroller.k3s.cattle.io/enablelb": "true"}),
      node("b", internal="10.0.0.2")], ["10.0.0.1"]),
    ("another class is not ours", svc(cls="example.com/lb"), [node("a", internal="10.0.0.1")], None),
    ("not a load balancer: nothing", svc("NodePort"), [node("a", internal="10.0.0.1")], []),
    ("duplicate addresses once", svc(), [node("a", internal="10.0.0.1"), node("b", internal="10.0.0.1")],
     ["10.0.0.1"]),
])
def test_desired_ingress(name, service, nodes, want):
    assert ips(desired_ingress(service, nodes)) == want


def test_ingress_shape():
    assert desired_ingress(svc(), [node("a", internal="10.0.0.1")]) == [{"ip": "10.0.0.1", "ipMode": "VIP"}]


@pytest.mark.parametrize(("service", "nodes", "patch"), [
    (svc(), [node("a", internal="10.0.0.1")],
     {"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1", "ipMode": "VIP"}]}}}),
    (svc(ingress=["10.0.0.1"]), [node("a", internal="10.0.0.1")], None),  # in sync
    (svc(ingress=["10.0.0.1"]), [node("a", internal="10.0.0.1", ready=False)],
     {"status": {"loadBalancer": {"ingress": None}}}),  # the node went away
    (svc("ClusterIP", ingress=["10.0.0.1"]), [node("a", internal="10.0.0.1")],
     {"status": {"loadBalancer": {"ingress": None}}}),  # type changed: cleared
    (svc("ClusterIP"), [node("a", internal="10.0.0.1")], None),
    (svc(cls="x/y", ingress=["1.2.3.4"]), [node("a", internal="10.0.0.1")], None),
])
def test_plan(service, nodes, patch):
    assert plan(service, nodes) == patch


def test_node_address_none():
    assert node_address({"status": {}}) is None
