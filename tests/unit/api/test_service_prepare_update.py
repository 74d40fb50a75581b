"""The Service's PrepareForUpdate: allocated values kept, type-dependent fields dropped."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.core import prepare_service_update


def svc(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "s"}, "spec": spec}


NP_OLD = svc(type="NodePort", clusterIP="10.43.1.1", clusterIPs=["10.43.1.1"], externalTrafficPolicy="Cluster",
             ports=[{"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30081}])


@pytest.mark.parametrize(("name", "old", "new", "want"), [
    ("allocated values carried over", NP_OLD,
     svc(type="NodePort", externalTrafficPolicy="Cluster", ports=[{"name": "b", "port": 81}, {"name": "a", "port": 80}]),
     svc(type="NodePort", externalTrafficPolicy="Cluster", clusterIP="10.43.1.1", clusterIPs=["10.43.1.1"],
         ports=[{"name": "b", "port": 81, "nodePort": 30081}, {"name": "a", "port": 80, "nodePort": 30080}])),
    ("a port the client already uses is not copied twice", NP_OLD,
     svc(type="NodePort", externalTrafficPolicy="Cluster",
         ports=[{"name": "a", "port": 80}, {"name": "b", "port": 81, "nodePort": 30080}]),
     svc(type="NodePort", externalTrafficPolicy="Cluster", clusterIP="10.43.1.1", clusterIPs=["10.43.1.1"],
         ports=[{"name": "a", "port": 80}, {"name": "b", "port": 81, "nodePort": 30080}])),
    ("NodePort to ClusterIP drops untouched node ports", NP_OLD,
     {**copy.deepcopy(NP_OLD), "spec": {**copy.deepcopy(NP_OLD["spec"]), "type": "ClusterIP"}},
     svc(type="ClusterIP", clusterIP="10.43.1.1", clusterIPs=["10.43.1.1"],
         ports=[{"name": "a", "port": 80}, {"name": "b", "port": 81}])),
    ("to ExternalName drops the untouched ClusterIP",
     svc(type="ClusterIP", clusterIP="10.43.1.1", clusterIPs=["10.43.1.1"], ipFamilies=["IPv4"],
         ipFamilyPolicy="SingleStack", internalTrafficPolicy="Cluster"),
     svc(type="ExternalName", externalName="a.example.com", clusterIP="10.43.1.1", clusterIPs=["10.43.1.1"],
         ipFamilies=["IPv4"], ipFamilyPolicy="SingleStack", internalTrafficPolicy="Cluster"),
     svc(type="ExternalName", externalName="a.example.com")),
    ("a ClusterIP changed by the client is left for validation",
     svc(type="ClusterIP", clusterIP="10.43.1.1"), svc(type="ClusterIP", clusterIP="10.43.9.9"),
     svc(type="ClusterIP", clusterIP="10.43.9.9")),
    ("health check port kept for LoadBalancer/Local",
     svc(type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=30500),
     svc(type="LoadBalancer", externalTrafficPolicy="Local"),
     svc(type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=30500)),
    ("LoadBalancer to ClusterIP drops its fields",
     svc(type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=30500,
         allocateLoadBalancerNodePorts=True, loadBalancerClass="x/y"),
     svc(type="ClusterIP", externalTrafficPolicy="Local", healthCheckNodePort=30500,
         allocateLoadBalancerNodePorts=True, loadBalancerClass="x/y"),
     svc(type="ClusterIP")),
])
def test_prepare_update(name, old, new, want):
    new = copy.deepcopy(new)
    prepare_service_update(new, copy.deepcopy(old))
    assert new == want


@pytest.mark.parametrize(("spec", "field", "message"), [
    ({"type": "ExternalName", "externalName": "a.example.com", "clusterIP": "10.43.0.9"}, "spec.clusterIPs",
     "Forbidden: may not be set for ExternalName services"),
    ({"type": "NodePort", "ports": [{"name": "a", "port": 80, "nodePort": 30080},
                                    {"name": "b", "port": 81, "nodePort": 30080}]},
     "spec.ports[1].nodePort", "Duplicate value: 30080"),
    ({"type": "NodePort", "healthCheckNodePort": 30500, "ports": [{"port": 80}]}, "spec.healthCheckNodePort",
     "Invalid value: 30500: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"),
    ({"type": "NodePort", "ports": [{"port": 80, "nodePort": 70000}]}, "spec.ports[0].nodePort",
     "Invalid value: 70000: must be between 1 and 65535, inclusive"),
])
def test_validation_of_allocated_fields(spec, field, message):
    from fleet.api.kinds.core import validate_service

    causes = validate_service({"metadata": {"name": "s", "namespace": "default"}, "spec": spec}, None)
    assert {"field": field, "message": message} in [{"field": c["field"], "message": c["message"]} for c in causes]


def test_same_node_port_for_two_protocols_is_valid():
    from fleet.api.kinds.core import validate_service

    spec = {"type": "NodePort", "ports": [{"name": "a", "port": 53, "protocol": "UDP", "nodePort": 30053},
                                          {"name": "b", "port": 53, "protocol": "TCP", "nodePort": 30053}]}
    assert validate_service({"metadata": {"name": "s", "namespace": "default"}, "spec": spec}, None) == []
