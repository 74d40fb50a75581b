"""The allocation repair: `plan` table-driven, then passes of the loop over a real store."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from fleet.api import meta
from fleet.server.svcalloc import (
    IP_PREFIX,
    PORT_PREFIX,
    ServiceAllocator,
    ip_address_object,
    ip_key,
    port_key,
    port_reservation,
)
from fleet.server.svcalloc_range import PortRange, ServiceIPRange
from fleet.server.svcrepair import SERVICES_PREFIX, AllocationRepair, plan
from fleet.store import open_store

R = ServiceIPRange("10.43.0.0/16")
P = PortRange.parse("30000-32767")


def svc(name: str, ip: str | None = None, *, node_ports: tuple[int, ...] = (), ns: str = "default",
        created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "NodePort" if node_ports else "ClusterIP",
                            "ports": [{"port": 80 + i, "nodePort": p} for i, p in enumerate(node_ports)]
                            or [{"port": 80}]}
    if ip:
        spec["clusterIP"], spec["clusterIPs"] = ip, [ip]
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": created}, "spec": spec}


def ipa(ip: str, owner: str, *, rv: int = 1, ns: str = "default", managed: str = "ipallocator.k8s.io"):
    o = ip_address_object(ip, svc(owner, ns=ns))
    o["metadata"]["labels"]["ipaddress.kubernetes.io/managed-by"] = managed
    o["metadata"]["resourceVersion"] = str(rv)
    return o


def res(port: int, owner: str, *, rv: int = 1):
    o = port_reservation(port, svc(owner))
    o["metadata"]["resourceVersion"] = str(rv)
    return o


@pytest.mark.parametrize(("name", "services", "ips", "ports", "suspects", "pending", "want"), [
    ("consistent", [svc("a", "10.43.1.1", node_ports=(30001,))], [ipa("10.43.1.1", "a")], [res(30001, "a")],
     {}, set(), {}),
    ("missing ip and port are recreated", [svc("a", "10.43.1.1", node_ports=(30001,))], [], [], {}, set(),
     {"create_ips": [("10.43.1.1", ("default", "a"))], "create_ports": [(30001, ("default", "a"))],
      "events": ["ClusterIPNotAllocated", "PortNotAllocated"]}),
    ("leak seen once is only suspected", [], [ipa("10.43.1.1", "gone", rv=7)], [res(30001, "gone", rv=8)], {},
     set(), {"suspects": {ip_key("10.43.1.1"): 7, port_key(30001): 8}}),
    ("leak seen twice is deleted", [], [ipa("10.43.1.1", "gone", rv=7)], [res(30001, "gone", rv=8)],
     {ip_key("10.43.1.1"): 7, port_key(30001): 8}, set(),
     {"delete": [(ip_key("10.43.1.1"), 7), (port_key(30001), 8)],
      "suspects": {ip_key("10.43.1.1"): 7, port_key(30001): 8}}),
    ("a leak rewritten since is suspected again", [], [ipa("10.43.1.1", "gone", rv=9)], [],
     {ip_key("10.43.1.1"): 7}, set(), {"suspects": {ip_key("10.43.1.1"): 9}}),
    ("in-flight reservations are never leaks", [], [ipa("10.43.1.1", "new", rv=7)], [],
     {ip_key("10.43.1.1"): 7}, {ip_key("10.43.1.1")}, {}),
    ("a service holding another ip leaks its old one", [svc("a", "10.43.1.2")],
     [ipa("10.43.1.1", "a"), ipa("10.43.1.2", "a")], [], {}, set(), {"suspects": {ip_key("10.43.1.1"): 1}}),
    ("duplicate ip: the non-owner is told", [svc("a", "10.43.1.1"), svc("b", "10.43.1.1")],
     [ipa("10.43.1.1", "b")], [], {}, set(), {"events": ["ClusterIPAlreadyAllocated"], "event_on": ["a"]}),
    ("duplicate ip without reservation: oldest gets it", [
        svc("b", "10.43.1.1", created="2026-01-02T00:00:00Z"), svc("a", "10.43.1.1")], [], [], {}, set(),
     {"create_ips": [("10.43.1.1", ("default", "a"))], "events": ["ClusterIPNotAllocated",
                                                                  "ClusterIPAlreadyAllocated"],
      "event_on": ["a", "b"]}),
    ("duplicate port", [svc("a", "10.43.1.1", node_ports=(30001,)), svc("b", "10.43.1.2", node_ports=(30001,))],
     [ipa("10.43.1.1", "a"), ipa("10.43.1.2", "b")], [res(30001, "a")], {}, set(),
     {"events": ["PortAlreadyAllocated"], "event_on": ["b"]}),
    ("out of range", [svc("a", "10.99.0.1", node_ports=(8080,))], [], [], {}, set(),
     {"events": ["ClusterIPOutOfRange", "PortOutOfRange"]}),
    ("foreign ipaddresses are left alone", [], [ipa("10.43.1.1", "x", managed="someone-else")], [], {}, set(), {}),
])
def test_plan(name, services, ips, ports, suspects, pending, want):
    p = plan(services, ips, ports, R, P, suspects=suspects, pending=pending)
    assert p.create_ips == want.get("create_ips", [])
    assert p.create_ports == want.get("create_ports", [])
    assert p.delete == want.get("delete", [])
    assert p.suspects == want.get("suspects", {})
    assert [e[1] for e in p.events] == want.get("events", [])
    if "event_on" in want:
        assert [e[0][1] for e in p.events] == want["event_on"]


def test_event_messages():
    p = plan([svc("a", "10.43.1.1")], [], [], R, P)
    assert p.events[0][2] == "Cluster IP [IPv4]:10.43.1.1 is not allocated; repairing"
    p = plan([svc("a", "10.99.0.1")], [], [], R, P)
    assert p.events[0][2] == ("Cluster IP [IPv4]:10.99.0.1 is not within the configured Service CIDR "
                              "10.43.0.0/16; please recreate service")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((obj["metadata"]["name"], type_, reason))


async def test_repair_passes_over_the_store(tmp_path):
    async with open_store(tmp_path / "fleet.db", sync="OFF", compact_interval=0) as store:
        alloc = ServiceAllocator(store, R, P, rng=random.Random(1))
        rec = Recorder()
        repair = AllocationRepair(store, alloc, interval=3600, events=rec)
        # A Service whose reservations are missing, and a leaked IPAddress + port.
        await store.create(meta.store_key("", "services", "default", "fa-a"), svc("fa-a", "10.43.5.5",
                                                                                    node_ports=(30005,)))
        await store.create(ip_key("10.43.6.6"), ip_address_object("10.43.6.6", svc("fa-gone")))
        await store.create(port_key(30006), port_reservation(30006, svc("fa-gone")))
        # An in-flight create (reserved, Service not written yet) must survive both passes.
        alloc.pending.add(ip_key("10.43.7.7"))
        await store.create(ip_key("10.43.7.7"), ip_address_object("10.43.7.7", svc("fa-new")))

        await repair.run_once()
        keys = {o["metadata"]["name"] for o in (await store.list(IP_PREFIX)).items}
        assert keys == {"10.43.5.5", "10.43.6.6", "10.43.7.7"}  # recreated; leak only suspected
        assert {o["metadata"]["name"] for o in (await store.list(PORT_PREFIX)).items} == {"30005", "30006"}
        assert ("fa-a", "Warning", "ClusterIPNotAllocated") in rec.events
        assert ("fa-a", "Warning", "PortNotAllocated") in rec.events

        await repair.run_once()
        keys = {o["metadata"]["name"] for o in (await store.list(IP_PREFIX)).items}
        assert keys == {"10.43.5.5", "10.43.7.7"}
        assert {o["metadata"]["name"] for o in (await store.list(PORT_PREFIX)).items} == {"30005"}
        assert len((await store.list(SERVICES_PREFIX)).items) == 1

        # The in-flight create finishes: nothing more to do.
        alloc.pending.clear()
        await store.create(meta.store_key("", "services", "default", "fa-new"), svc("fa-new", "10.43.7.7"))
        p = await repair.run_once()
        assert not p.delete and not p.suspects and not p.create_ips


async def test_loop_passes_at_start_then_every_interval(autojump_clock):
    # No store: run_once is replaced (worker threads and an autojumping clock do not mix).
    repair = AllocationRepair(None, None, interval=30)  # type: ignore[arg-type]
    times: list[float] = []

    async def run_once() -> None:
        times.append(trio.current_time())

    repair.run_once = run_once  # type: ignore[method-assign]
    async with trio.open_nursery() as n:
        await n.start(repair.run)
        assert len(times) == 1  # started after the first pass
        await trio.sleep(95)
        n.cancel_scope.cancel()
    assert [round(t - times[0]) for t in times] == [0, 30, 60, 90]
