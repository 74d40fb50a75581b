"""Object factories for the NetworkPolicy tests (plain Kubernetes dicts)."""

from __future__ import annotations

from typing import Any


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def pod(name: str, ns: str, ip: str | None, labels: dict[str, str] | None = None, *,
        ports: dict[str, int | tuple[int, str]] | None = None, host_network: bool = False,
        phase: str = "Running") -> dict[str, Any]:
    cports = []
    for pname, spec in (ports or {}).items():
        number, proto = spec if isinstance(spec, tuple) else (spec, "TCP")
        cports.append({"name": pname, "containerPort": number, "protocol": proto})
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "ports": cports}]}
    if host_network:
        spec["hostNetwork"] = True
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {})},
            "spec": spec, "status": status}


def policy(name: str, ns: str, selector: dict[str, Any] | None = None, *,
           ingress: list[Any] | None = None, egress: list[Any] | None = None,
           types: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector if selector is not None else {}}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    if types is not None:
        spec["policyTypes"] = types
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def service(name: str, ns: str, cluster_ip: str, ports: list[dict[str, Any]], *,
            selector: dict[str, str] | None = None,
            labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "ports": ports}
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {})}, "spec": spec}


def endpoint_slice(service_name: str, ns: str, ports: list[dict[str, Any]],
                   endpoints: list[tuple[str, str | None, bool]]) -> dict[str, Any]:
    """`endpoints`: (address, target pod name or None, ready)."""
    eps = []
    for addr, target, ready in endpoints:
        ep: dict[str, Any] = {"addresses": [addr], "conditions": {"ready": ready}}
        if target is not None:
            ep["targetRef"] = {"kind": "Pod", "namespace": ns, "name": target}
        eps.append(ep)
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{service_name}-abc", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": service_name}},
            "ports": ports, "endpoints": eps}
