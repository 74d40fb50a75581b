"""The scheduler and node IPAM against a real `fleet server`, through fleet.client.

Nodes here are plain API objects (no agents): the scheduler only reads their
allocatable and labels.  The test runs its own scheduler under a private
`schedulerName`, and its own node IPAM on a private cluster CIDR, so it tests
these `run()` functions even when the server runs its own instances too (the
ranges are disjoint, so whichever writes a node's podCIDR first, they stay
unique).
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from fleet.client import ApiException, Client, load_kubeconfig
from fleet.controllers import nodeipam
from fleet.scheduler import SchedulerConfig
from fleet.scheduler import run as run_scheduler
from tests.conftest import FleetServer

pytestmark = pytest.mark.e2e

SCHEDULER = "fleet-e2e-scheduler"


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 15.0) -> Any:
    """Poll `check` until it returns something truthy."""
    with trio.fail_after(timeout):
        while True:
            got = await check()
            if got:
                return got
            await trio.sleep(0.05)


def node(name: str, group: str, cpu: str, memory: str, **labels: str) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"e2e-group": group, **labels}},
            "status": {"capacity": alloc, "allocatable": alloc}}


def pod(name: str, group: str, cpu: str, **selector: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": SCHEDULER,
                     # Pinned to this test's nodes: the server may have others (its agent's).
                     "nodeSelector": {"e2e-group": group, **selector},
                     "containers": [{"name": "c", "image": "busybox:1.36",
                                     "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}


async def test_pods_are_bound_to_fitting_nodes_and_nodes_get_pod_cidrs(
        fleet_server: FleetServer, namespace: str) -> None:
    cfg = load_kubeconfig(str(fleet_server.kubeconfig))
    group = uuid.uuid4().hex[:8]
    names = {size: f"{size}-{group}" for size in ("small", "medium", "large", "huge")}
    async with Client(cfg) as c, trio.open_nursery() as nursery:
        await c.create("v1", "nodes", node(names["small"], group, "1", "2Gi"))
        await c.create("v1", "nodes", node(names["medium"], group, "2", "4Gi", disk="ssd"))
        await c.create("v1", "nodes", node(names["large"], group, "4", "8Gi"))
        await nursery.start(run_scheduler, cfg, SchedulerConfig(
            scheduler_name=SCHEDULER, initial_backoff=0.1, max_backoff=0.5))
        await nursery.start(nodeipam.run, cfg, nodeipam.NodeIPAMConfig(cluster_cidr="10.99.0.0/16"))

        wanted = {"ssd": ("500m", {"disk": "ssd"}, {names["medium"]}),
                  "three-cpus": ("3", {}, {names["large"]}),
                  "anywhere": ("100m", {}, {names["small"], names["medium"], names["large"]})}
        for name, (cpu, sel, _) in wanted.items():
            await c.create("v1", "pods", pod(name, group, cpu, **sel), namespace)
        await c.create("v1", "pods", pod("too-big", group, "16"), namespace)

        async def bound(name: str) -> dict[str, Any] | None:
            p = await c.get_object("v1", "pods", name, namespace)
            return p if p["spec"].get("nodeName") else None

        for name, (_, _, nodes) in wanted.items():
            p = await eventually(lambda name=name: bound(name))
            assert p["spec"]["nodeName"] in nodes, name
            conds = {x["type"]: x["status"] for x in p["status"]["conditions"]}
            assert conds["PodScheduled"] == "True"
            assert p["status"]["phase"] == "Pending" and p["status"]["qosClass"] == "Burstable"

        async def failed_event() -> dict[str, Any] | None:
            events = await c.list("v1", "events", namespace)
            for e in events["items"]:
                if e["involvedObject"]["name"] == "too-big" and e["reason"] == "FailedScheduling":
                    return e
            return None

        event = await eventually(failed_event)
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Pod"
        assert event["message"].startswith("0/") and "3 Insufficient cpu" in event["message"]
        assert event["source"]["component"] == SCHEDULER

        async def unschedulable_condition() -> dict[str, Any] | None:
            p = await c.get_object("v1", "pods", "too-big", namespace)
            assert not p["spec"].get("nodeName")
            conds = [x for x in p["status"].get("conditions") or [] if x["type"] == "PodScheduled"]
            return conds[0] if conds else None

        cond = await eventually(unschedulable_condition)
        assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
        assert cond["message"] == event["message"]

        # A node big enough appears: the parked pod is retried and bound there.
        await c.create("v1", "nodes", node(names["huge"], group, "32", "64Gi"))
        p = await eventually(lambda: bound("too-big"))
        assert p["spec"]["nodeName"] == names["huge"]

        # Binding an already bound pod is a conflict.
        with pytest.raises(ApiException) as exc:
            await c.create("v1", "pods", {"apiVersion": "v1", "kind": "Binding",
                                          "metadata": {"name": "too-big"},
                                          "target": {"apiVersion": "v1", "kind": "Node",
                                                     "name": names["small"]}},
                           namespace, name="too-big", subresource="binding")
        assert exc.value.code == 409
        assert f'pod too-big is already assigned to node "{names["huge"]}"' in exc.value.message

        # Every node got its own pod CIDR.
        async def cidrs() -> dict[str, str] | None:
            out = {}
            for n in names.values():
                spec = (await c.get_object("v1", "nodes", n))["spec"]
                if not spec.get("podCIDR"):
                    return None
                assert spec["podCIDRs"] == [spec["podCIDR"]]
                out[n] = spec["podCIDR"]
            return out

        got = await eventually(cidrs)
        assert len(set(got.values())) == len(got)
        for cidr in got.values():
            assert ipaddress.ip_network(cidr).prefixlen == 24
        nursery.cancel_scope.cancel()
