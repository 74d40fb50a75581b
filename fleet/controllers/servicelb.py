"""ServiceLB: a LoadBalancer Service is answered on the nodes' own addresses (k3s' servicelb).

k3s has no cloud load balancer either: its servicelb controller publishes, as a
`type: LoadBalancer` Service's `status.loadBalancer.ingress`, the addresses of
the nodes that carry the Service's ports (the node dataplane forwards traffic
to those addresses like NodePort traffic).  Fleet's does the same without the
per-Service DaemonSet k3s runs: the kernel dataplane already listens on every
node, so the ingress is every Ready node's ExternalIP, else its InternalIP,
with `ipMode: VIP`.  When some nodes carry the label
`svccontroller.k3s.cattle.io/enablelb=true`, only those are used (k3s' rule).

A Service with a `loadBalancerClass` belongs to another implementation and is
left alone; a Service that stops being a LoadBalancer has its ingress cleared.
`plan()` is the pure decision; `ServiceLBController` is the loop on the
shared services and nodes informers (`service-lb` in --controllers), writing
through the status subresource and recording `UpdatedIngressIP` Normal events
as k3s does.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from fleet.api import conditions
from fleet.client import MERGE_PATCH, ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, key_of, split_key

ENABLE_LB_LABEL = "svccontroller.k3s.cattle.io/enablelb"

def node_address(node: dict[str, Any]) -> str | None:
    """The address a node answers LoadBalancer traffic on: ExternalIP, else InternalIP."""
    addrs = [a for a in (node.get("status") or {}).get("addresses") or [] if isinstance(a, dict)]
    for kind in ("ExternalIP", "InternalIP"):
        for a in addrs:
            if a.get("type") == kind and a.get("address"):
                return str(a["address"])
    return None


def lb_nodes(nodes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ready, not deleted nodes; only the `enablelb=true` ones when any node has that label."""
    ready = [n for n in nodes if conditions.is_true(n, "Ready")
             and not (n.get("metadata") or {}).get("deletionTimestamp")]
    labelled = [n for n in ready if ((n.get("metadata") or {}).get("labels") or {}).get(ENABLE_LB_LABEL) == "true"]
    return labelled or ready


def _sort_key(addr: str) -> tuple[int, int | str]:
    try:
        ip = ipaddress.ip_address(addr)
        return ip.version, int(ip)
    except ValueError:
        return 9, addr


def desired_ingress(svc: dict[str, Any], nodes: Iterable[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The ingress list the Service should have; None when it is not ServiceLB's."""
    spec = svc.get("spec") or {}
    if spec.get("type") != "LoadBalancer":
        return []
    if spec.get("loadBalancerClass"):
        return None
    addrs = {a for a in (node_address(n) for n in lb_nodes(nodes)) if a}
    return [{"ip": a, "ipMode": "VIP"} for a in sorted(addrs, key=_sort_key)]


def plan(svc: dict[str, Any], nodes: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The merge patch of the Service's status, or None when nothing is to change."""
    want = desired_ingress(svc, nodes)
    if want is None:
        return None
    have = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    if have == want:
        return None
    return {"status": {"loadBalancer": {"ingress": want or None}}}


class ServiceLBController(QueueWorker):
    name = "service-lb"
    workers = 1
    kind = "Service"

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.services: SharedInformer = ctx.informers.informer("v1", "services")
        self.nodes: SharedInformer = ctx.informers.informer("v1", "nodes")
        self.services.add_handler(self._on_service)
        self.nodes.add_handler(self._on_node)

    def _on_service(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        was_lb = old is not None and (old.get("spec") or {}).get("type") == "LoadBalancer"
        if (new.get("spec") or {}).get("type") == "LoadBalancer" or was_lb or \
                ((new.get("status") or {}).get("loadBalancer") or {}).get("ingress"):
            self.enqueue(new)

    def _on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        before = node_address(old) if old is not None and lb_nodes([old]) else None
        after = node_address(new) if new is not None and lb_nodes([new]) else None
        labels = (((old or {}).get("metadata") or {}).get("labels") or {}).get(ENABLE_LB_LABEL), \
            (((new or {}).get("metadata") or {}).get("labels") or {}).get(ENABLE_LB_LABEL)
        if before == after and labels[0] == labels[1] and etype == "MODIFIED":
            return
        for s in self.services.list():
            if (s.get("spec") or {}).get("type") == "LoadBalancer":
                self.queue.add(key_of(s))

    async def reconcile(self, key: str) -> float | None:
        ns, name = split_key(key)
        svc = self.services.get(key)
        if svc is None:
            return None
        patch = plan(svc, self.nodes.list())
        if patch is None:
            return None
        try:
            await self.ctx.client.patch("v1", "services", name, patch, MERGE_PATCH, ns, subresource="status")
        except ApiException as e:
            if e.code == 404:
                return None
            raise
        ingress = patch["status"]["loadBalancer"]["ingress"] or []
        if self.ctx.events is not None and ingress:
            self.ctx.events.record(svc, "Normal", "UpdatedIngressIP", "LoadBalancer Ingress IP addresses updated: "
                                   + ", ".join(i["ip"] for i in ingress))
        return None


__all__ = ["ServiceLBController", "desired_ingress", "lb_nodes", "node_address", "plan"]
