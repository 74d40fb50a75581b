"""Objects for the endpoints controllers' unit tests, and a fake store that applies a
slice plan the way the API server would (names for generateName, uids, revisions)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from fleet.controllers.endpointslice_plan import SlicePlan

NS = "fe-ns"
SVC_UID = "svc-uid-1"


def service(name: str = "web", *, selector: dict[str, str] | None = None, ports: list[dict[str, Any]] | None = None,
            cluster_ip: str | None = "10.43.0.20", publish: bool = False, labels: dict[str, str] | None = None,
            uid: str = SVC_UID, stype: str = "ClusterIP", **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"type": stype, "selector": {"app": "web"} if selector is None else selector,
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
                 if ports is None else ports, **spec},
    }
    if cluster_ip is not None:
        s["spec"]["clusterIP"] = cluster_ip
    if publish:
        s["spec"]["publishNotReadyAddresses"] = True
    if labels:
        s["metadata"]["labels"] = labels
    return s


def pod(name: str, ip: str | None = "10.42.0.1", *, labels: dict[str, str] | None = None, ready: bool = True,
        node: str = "n1", deleting: bool = False, phase: str = "Running",
        ports: list[dict[str, Any]] | None = None, hostname: str | None = None, subdomain: str | None = None,
        ready_since: str = "2026-01-01T00:01:00Z", ns: str = NS) -> dict[str, Any]:
    p: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": {"app": "web"}
                     if labels is None else labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "ports": ports or []}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                   "lastTransitionTime": ready_since}]},
    }
    if ip:
        p["status"]["podIP"] = ip
        p["status"]["podIPs"] = [{"ip": ip}]
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    if hostname:
        p["spec"]["hostname"] = hostname
    if subdomain:
        p["spec"]["subdomain"] = subdomain
    return p


def node(name: str = "n1", zone: str | None = "zone-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone} if zone else {}}}


NODES = {"n1": node("n1"), "n2": node("n2", "zone-b")}


class FakeSlices:
    """The slices of one namespace, written as the API server would."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(100)
        self._names = itertools.count(1)
        self.writes = 0

    def apply(self, plan: SlicePlan) -> None:
        for body in plan.create:
            obj = copy.deepcopy(body)
            md = obj["metadata"]
            assert "name" not in md
            md["name"] = f"{md.pop('generateName')}{next(self._names):05d}"
            md["uid"] = f"slice-uid-{md['name']}"
            md["resourceVersion"] = str(next(self._rv))
            self.items[md["name"]] = obj
            self.writes += 1
        for body in plan.update:
            obj = copy.deepcopy(body)
            md = obj["metadata"]
            stored = self.items[md["name"]]
            assert md.get("resourceVersion") == stored["metadata"]["resourceVersion"], "stale update"
            md["uid"] = stored["metadata"]["uid"]
            md["resourceVersion"] = str(next(self._rv))
            self.items[md["name"]] = obj
            self.writes += 1
        for old in plan.delete:
            del self.items[old["metadata"]["name"]]
            self.writes += 1

    def list(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for s in self.items.values()]

    def addresses(self) -> list[str]:
        return sorted(a for s in self.items.values() for e in s.get("endpoints") or [] for a in e["addresses"])
