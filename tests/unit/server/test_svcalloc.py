"""The Service allocation strategy through the real write path (in-process API, SQLite store)."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager
from typing import Any

import trio

from fleet.server.svcalloc import IP_PREFIX, PORT_PREFIX, ServiceAllocator
from fleet.server.svcalloc_range import PortRange, ServiceIPRange
from fleet.testing.apiserver import open_api

NS = "default"
SVCS = f"/api/v1/namespaces/{NS}/services"


@asynccontextmanager
async def api_with_allocator(tmp_path, cidr="10.43.0.0/16", ports="30000-32767"):
    def allocator(store):
        return ServiceAllocator(store, ServiceIPRange(cidr), PortRange.parse(ports), rng=random.Random(5))

    async with open_api(tmp_path, namespace_controller=False, sync="OFF", service_allocator=allocator) as api:
        yield api, api.server.resources.allocators[("", "services")]


def svc(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("ports", [{"port": 80}])
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


async def reserved(api) -> tuple[dict[str, tuple[str, str]], dict[int, tuple[str, str]]]:
    ips = {o["metadata"]["name"]: (o["spec"]["parentRef"]["namespace"], o["spec"]["parentRef"]["name"])
           for o in (await api.store.list(IP_PREFIX)).items}
    ports = {int(o["metadata"]["name"]): (o["parentRef"]["namespace"], o["parentRef"]["name"])
             for o in (await api.store.list(PORT_PREFIX)).items}
    return ips, ports


async def test_cluster_ip_allocated_and_recorded_as_ipaddress(tmp_path):
    async with api_with_allocator(tmp_path) as (api, alloc):
        code, body = await api.json("POST", SVCS, svc("fa-a"))
        assert code == 201, body
        spec = body["spec"]
        ip = spec["clusterIP"]
        assert alloc.ip_range.contains(ip) and ip != "10.43.0.1"
        assert spec["clusterIPs"] == [ip]
        assert spec["ipFamilies"] == ["IPv4"] and spec["ipFamilyPolicy"] == "SingleStack"
        code, addr = await api.json("GET", f"/apis/networking.k8s.io/v1/ipaddresses/{ip}")
        assert code == 200
        assert addr["spec"]["parentRef"] == {"group": "", "resource": "services", "namespace": NS, "name": "fa-a"}
        assert addr["metadata"]["labels"]["ipaddress.kubernetes.io/managed-by"] == "ipallocator.k8s.io"
        assert not alloc.pending


async def test_requested_ip_honoured_duplicate_and_out_of_range_refused(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        code, body = await api.json("POST", SVCS, svc("fa-a", clusterIP="10.43.0.5"))
        assert code == 201 and body["spec"]["clusterIPs"] == ["10.43.0.5"]
        code, body = await api.json("POST", SVCS, svc("fa-b", clusterIP="10.43.0.5"))
        assert code == 422, body
        assert body["message"] == ('Service "fa-b" is invalid: spec.clusterIPs: Invalid value: ["10.43.0.5"]: '
                                   "failed to allocate IP 10.43.0.5: provided IP is already allocated")
        assert body["details"]["causes"][0]["field"] == "spec.clusterIPs"
        code, body = await api.json("POST", SVCS, svc("fa-c", clusterIP="10.44.0.5"))
        assert code == 422
        assert body["message"].endswith("failed to allocate IP 10.44.0.5: the provided IP (10.44.0.5) is not in "
                                        "the valid range. The range of valid IPs is 10.43.0.0/16")
        ips, _ = await reserved(api)
        assert ips == {"10.43.0.5": (NS, "fa-a")}
        # nothing of the refused ones was stored
        assert (await api.json("GET", f"{SVCS}/fa-b"))[0] == 404


async def test_single_stack_cluster_refuses_other_families(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        code, body = await api.json("POST", SVCS, svc("fa-a", ipFamilyPolicy="RequireDualStack"))
        assert code == 422 and "spec.ipFamilyPolicy" in body["message"], body
        code, body = await api.json("POST", SVCS, svc("fa-b", ipFamilies=["IPv6"]))
        assert code == 422 and 'spec.ipFamilies[0]: Invalid value: "IPv6"' in body["message"], body
        code, body = await api.json("POST", SVCS, svc("fa-c", ipFamilyPolicy="PreferDualStack"))
        assert code == 201 and body["spec"]["ipFamilies"] == ["IPv4"], body
        ips, _ = await reserved(api)
        assert list(ips.values()) == [(NS, "fa-c")]


async def test_headless_and_external_name_get_no_address(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        code, h = await api.json("POST", SVCS, svc("fa-h", clusterIP="None"))
        assert code == 201 and h["spec"]["clusterIPs"] == ["None"]
        code, e = await api.json("POST", SVCS, svc("fa-e", type="ExternalName", externalName="a.example.com"))
        assert code == 201, e
        assert "clusterIP" not in e["spec"] and "clusterIPs" not in e["spec"]
        assert await reserved(api) == ({}, {})


async def test_node_ports(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        code, a = await api.json("POST", SVCS, svc("fa-a", type="NodePort",
                                                   ports=[{"name": "x", "port": 80, "nodePort": 30080},
                                                          {"name": "y", "port": 81}]))
        assert code == 201, a
        assert a["spec"]["ports"][0]["nodePort"] == 30080
        dyn = a["spec"]["ports"][1]["nodePort"]
        assert 30000 <= dyn <= 32767 and dyn != 30080
        code, b = await api.json("POST", SVCS, svc("fa-b", type="NodePort", ports=[{"port": 80, "nodePort": 30080}]))
        assert code == 422
        assert b["message"] == ('Service "fa-b" is invalid: spec.ports[0].nodePort: Invalid value: 30080: '
                                "provided port is already allocated")
        code, c = await api.json("POST", SVCS, svc("fa-c", type="NodePort", ports=[{"port": 80, "nodePort": 29999}]))
        assert code == 422
        assert c["message"].endswith("spec.ports[0].nodePort: Invalid value: 29999: provided port is not in the "
                                     "valid range. The range of valid ports is 30000-32767")
        _, ports = await reserved(api)
        assert ports == {30080: (NS, "fa-a"), dyn: (NS, "fa-a")}
        # the failed creates left no ClusterIP behind either
        ips, _ = await reserved(api)
        assert list(ips.values()) == [(NS, "fa-a")]


async def test_same_port_number_shares_one_node_port(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        code, a = await api.json("POST", SVCS, svc("fa-dns", type="NodePort", ports=[
            {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "x", "port": 54}]))
        assert code == 201, a
        nps = [p["nodePort"] for p in a["spec"]["ports"]]
        assert nps[0] == nps[1] != nps[2]
        _, ports = await reserved(api)
        assert set(ports) == {nps[0], nps[2]}
        code, b = await api.json("POST", SVCS, svc("fa-dns2", type="NodePort", ports=[
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "nodePort": 30053}]))
        assert code == 201, b
        assert [p["nodePort"] for p in b["spec"]["ports"]] == [30053, 30053]


async def test_load_balancer_ports(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        code, a = await api.json("POST", SVCS, svc("fa-lb", type="LoadBalancer", externalTrafficPolicy="Local"))
        assert code == 201, a
        assert a["spec"]["ports"][0]["nodePort"] > 0 and a["spec"]["healthCheckNodePort"] > 0
        code, b = await api.json("POST", SVCS, svc("fa-nonp", type="LoadBalancer",
                                                   allocateLoadBalancerNodePorts=False))
        assert code == 201, b
        assert "nodePort" not in b["spec"]["ports"][0] and "healthCheckNodePort" not in b["spec"]
        _, ports = await reserved(api)
        assert set(ports) == {a["spec"]["ports"][0]["nodePort"], a["spec"]["healthCheckNodePort"]}


async def test_updates_keep_type_changes_release_and_allocate(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        _, a = await api.json("POST", SVCS, svc("fa-a", type="NodePort", ports=[{"port": 80, "nodePort": 30080}]))
        ip = a["spec"]["clusterIP"]
        # A PUT without the allocated values keeps them.
        put = svc("fa-a", type="NodePort", ports=[{"port": 80}])
        code, b = await api.json("PUT", f"{SVCS}/fa-a", put)
        assert code == 200, b
        assert b["spec"]["clusterIP"] == ip and b["spec"]["ports"][0]["nodePort"] == 30080
        # NodePort → ClusterIP releases the port.
        code, c = await api.json("PATCH", f"{SVCS}/fa-a", {"spec": {"type": "ClusterIP"}},
                                 content_type="application/merge-patch+json")
        assert code == 200, c
        assert "nodePort" not in c["spec"]["ports"][0]
        assert await reserved(api) == ({ip: (NS, "fa-a")}, {})
        # ClusterIP → ExternalName releases the address.
        code, d = await api.json("PATCH", f"{SVCS}/fa-a", {"spec": {"type": "ExternalName",
                                                                     "externalName": "a.example.com"}},
                                 content_type="application/merge-patch+json")
        assert code == 200, d
        assert "clusterIP" not in d["spec"]
        assert await reserved(api) == ({}, {})
        # ... and back allocates a new one.
        code, e = await api.json("PATCH", f"{SVCS}/fa-a", {"spec": {"type": "ClusterIP", "externalName": None}},
                                 content_type="application/merge-patch+json")
        assert code == 200, e
        ips, _ = await reserved(api)
        assert ips == {e["spec"]["clusterIP"]: (NS, "fa-a")}
        # a changed ClusterIP is still refused (immutable)
        code, f = await api.json("PATCH", f"{SVCS}/fa-a", {"spec": {"clusterIP": "10.43.9.9",
                                                                     "clusterIPs": ["10.43.9.9"]}},
                                 content_type="application/merge-patch+json")
        assert code == 422 and "field is immutable" in f["message"]


async def test_port_removal_and_delete_release(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        _, a = await api.json("POST", SVCS, svc("fa-a", type="NodePort",
                                                ports=[{"name": "x", "port": 80, "nodePort": 30080},
                                                       {"name": "y", "port": 81, "nodePort": 30081}]))
        code, b = await api.json("PUT", f"{SVCS}/fa-a", svc("fa-a", type="NodePort",
                                                             ports=[{"name": "x", "port": 80}]))
        assert code == 200, b
        assert b["spec"]["ports"] == [{"name": "x", "port": 80, "nodePort": 30080, "protocol": "TCP",
                                       "targetPort": 80}]
        _, ports = await reserved(api)
        assert set(ports) == {30080}
        code, _ = await api.json("DELETE", f"{SVCS}/fa-a")
        assert code == 200
        assert await reserved(api) == ({}, {})
        # the port is free again
        code, c = await api.json("POST", SVCS, svc("fa-c", type="NodePort", ports=[{"port": 80, "nodePort": 30081}]))
        assert code == 201, c


async def test_finalizer_removal_releases(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        body = svc("fa-f")
        body["metadata"]["finalizers"] = ["example.com/hold"]
        _, a = await api.json("POST", SVCS, body)
        code, _ = await api.json("DELETE", f"{SVCS}/fa-f")
        assert code == 200
        ips, _ = await reserved(api)
        assert ips == {a["spec"]["clusterIP"]: (NS, "fa-f")}  # still there while it finalizes
        code, _ = await api.json("PATCH", f"{SVCS}/fa-f", {"metadata": {"finalizers": None}},
                                 content_type="application/merge-patch+json")
        assert code == 200
        assert await reserved(api) == ({}, {})


async def test_failed_store_write_and_dry_run_leave_nothing(tmp_path):
    async with api_with_allocator(tmp_path) as (api, _):
        _, a = await api.json("POST", SVCS, svc("fa-a"))
        code, b = await api.json("POST", SVCS, svc("fa-a", type="NodePort"))
        assert code == 409, b
        code, c = await api.json("POST", SVCS, svc("fa-dry", type="NodePort"), query={"dryRun": "All"})
        assert code == 201 and c["spec"]["clusterIP"] and c["spec"]["ports"][0]["nodePort"]
        code, d = await api.json("POST", SVCS, svc("fa-dry2", clusterIP=a["spec"]["clusterIP"]),
                                 query={"dryRun": "All"})
        assert code == 422 and "provided IP is already allocated" in d["message"]
        assert await reserved(api) == ({a["spec"]["clusterIP"]: (NS, "fa-a")}, {})


async def test_exhausted_range_names_the_range(tmp_path):
    async with api_with_allocator(tmp_path, cidr="10.43.0.0/29") as (api, alloc):  # .2-.6 dynamic
        for i in range(5):
            code, body = await api.json("POST", SVCS, svc(f"fa-{i}"))
            assert code == 201, body
        code, body = await api.json("POST", SVCS, svc("fa-full"))
        assert code == 500
        assert body["reason"] == "InternalError"
        assert "failed to allocate a serviceIP: range is full" in body["message"]
        assert "10.43.0.0/29" in body["message"]
        ips, _ = await reserved(api)
        assert sorted(ips) == [f"10.43.0.{i}" for i in range(2, 7)]


async def test_concurrent_creates_get_distinct_addresses(tmp_path):
    # A small range so that concurrent creates really collide on candidates.
    async with api_with_allocator(tmp_path, cidr="10.43.0.0/25") as (api, _):  # 125 dynamic addresses
        results: list[tuple[int, Any]] = []

        async def create(i: int) -> None:
            results.append(await api.json("POST", SVCS, svc(f"fa-{i}", type="NodePort")))

        async with trio.open_nursery() as n:
            for i in range(140):
                n.start_soon(create, i)
        ok = [b for c, b in results if c == 201]
        full = [b for c, b in results if c == 500]
        assert len(ok) == 125 and len(full) == 15
        assert len({b["spec"]["clusterIP"] for b in ok}) == 125
        assert len({b["spec"]["ports"][0]["nodePort"] for b in ok}) == 125
        ips, ports = await reserved(api)
        assert len(ips) == 125 and len(ports) == 125  # the refused ones released their ports
