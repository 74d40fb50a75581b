"""Service and EndpointSlice factories for the service proxy's unit tests."""

from __future__ import annotations

from typing import Any


def svc(name: str, ip: str | None = "10.43.0.10", ports: list[dict[str, Any]] | None = None,
        ns: str = "default", **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {})
    s: dict[str, Any] = {"apiVersion": "v1", "kind": "Service",
                         "metadata": {"namespace": ns, "name": name},
                         "spec": {"ports": ports if ports is not None else [{"name": "http", "port": 80}],
                                  **spec}, "status": status}
    if ip is not None:
        s["spec"]["clusterIP"] = ip
    return s


def ep(ip: str, node: str = "", ready: bool | None = True, serving: bool | None = None,
       terminating: bool | None = None) -> dict[str, Any]:
    conds: dict[str, Any] = {}
    for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating)):
        if v is not None:
            conds[k] = v
    out: dict[str, Any] = {"addresses": [ip], "conditions": conds}
    if node:
        out["nodeName"] = node
    return out


def eps(service: str, endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None,
        ns: str = "default", name: str | None = None, address_type: str = "IPv4") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": ns, "name": name or f"{service}-abc",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": address_type, "endpoints": endpoints,
            "ports": ports if ports is not None else [{"name": "http", "port": 8080, "protocol": "TCP"}]}
