"""`ensure_system_service`: the fixed-address, selector-less system Services (kubernetes, kube-dns)."""

from __future__ import annotations

import random

import pytest

from fleet.api import meta
from fleet.api.registry import default_registry
from fleet.server.svcalloc import IP_PREFIX, ServiceAllocator, ip_key
from fleet.server.svcalloc_range import PortRange, ServiceIPRange
from fleet.server.systemsvc import (
    ensure_default_service_cidr,
    ensure_kubernetes_service,
    ensure_system_service,
)
from fleet.store import open_store

REG = default_registry()
DNS_PORTS = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
DNS_EP_PORTS = [{"name": "dns", "port": 5353, "protocol": "UDP"}, {"name": "dns-tcp", "port": 5353, "protocol": "TCP"}]


async def ensure_dns(store, alloc, ip="10.43.0.10"):
    return await ensure_system_service(store, REG, alloc, namespace="kube-system", name="kube-dns", cluster_ip=ip,
                                       ports=DNS_PORTS, endpoint_ips=["127.0.0.1"], endpoint_ports=DNS_EP_PORTS,
                                       labels={"k8s-app": "kube-dns"})


@pytest.fixture
async def store_alloc(tmp_path):
    async with open_store(tmp_path / "fleet.db", sync="OFF", compact_interval=0) as store:
        yield store, ServiceAllocator(store, ServiceIPRange("10.43.0.0/16"), PortRange(), rng=random.Random(2))


async def test_creates_service_reservation_and_endpoints(store_alloc):
    store, alloc = store_alloc
    svc = await ensure_dns(store, alloc)
    assert svc["spec"]["clusterIP"] == "10.43.0.10" and svc["spec"]["clusterIPs"] == ["10.43.0.10"]
    assert [(p["name"], p["port"], p["protocol"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("dns", 53, "UDP", 53), ("dns-tcp", 53, "TCP", 53)]
    assert "selector" not in svc["spec"] and svc["metadata"]["labels"] == {"k8s-app": "kube-dns"}
    addr = await store.get(ip_key("10.43.0.10"))
    assert addr["spec"]["parentRef"]["name"] == "kube-dns"
    ep = await store.get(meta.store_key("", "endpoints", "kube-system", "kube-dns"))
    assert ep["subsets"] == [{"addresses": [{"ip": "127.0.0.1"}], "ports": DNS_EP_PORTS}]


async def test_idempotent_and_repairs_drift(store_alloc):
    store, alloc = store_alloc
    first = await ensure_dns(store, alloc)
    again = await ensure_dns(store, alloc)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    key = meta.store_key("", "services", "kube-system", "kube-dns")
    edited = dict(first, spec={**first["spec"], "ports": [{"name": "x", "port": 1, "protocol": "TCP"}]})
    await store.update(key, edited)
    await store.delete(meta.store_key("", "endpoints", "kube-system", "kube-dns"))
    repaired = await ensure_dns(store, alloc)
    assert [p["name"] for p in repaired["spec"]["ports"]] == ["dns", "dns-tcp"]
    assert (await store.get(meta.store_key("", "endpoints", "kube-system", "kube-dns")))["subsets"]


async def test_adopts_its_own_leaked_reservation_but_not_anothers(store_alloc):
    store, alloc = store_alloc
    await ensure_dns(store, alloc)
    await store.delete(meta.store_key("", "services", "kube-system", "kube-dns"))  # the IPAddress stays
    svc = await ensure_dns(store, alloc)
    assert svc["spec"]["clusterIP"] == "10.43.0.10"
    with pytest.raises(ValueError, match="allocated to another Service"):
        await ensure_system_service(store, REG, alloc, namespace="default", name="other", cluster_ip="10.43.0.10",
                                    ports=[{"name": "x", "port": 1}], endpoint_ips=[], endpoint_ports=[])
    with pytest.raises(ValueError, match="not in the valid range"):
        await ensure_dns(store, alloc, ip="10.99.0.10")


async def test_kubernetes_service_and_service_cidr(store_alloc):
    store, alloc = store_alloc
    svc = await ensure_kubernetes_service(store, REG, alloc, advertise_address="192.0.2.7", port=9300)
    assert svc["spec"]["clusterIP"] == "10.43.0.1"
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 9300}]
    assert svc["metadata"]["labels"] == {"component": "apiserver", "provider": "kubernetes"}
    ep = await store.get(meta.store_key("", "endpoints", "default", "kubernetes"))
    assert ep["subsets"] == [{"addresses": [{"ip": "192.0.2.7"}],
                              "ports": [{"name": "https", "port": 9300, "protocol": "TCP"}]}]
    await ensure_default_service_cidr(store, REG, "10.43.0.0/16")
    cidr = await store.get(meta.store_key("networking.k8s.io", "servicecidrs", None, "kubernetes"))
    assert cidr["spec"]["cidrs"] == ["10.43.0.0/16"]
    assert cidr["status"]["conditions"][0]["type"] == "Ready"
    assert [o["metadata"]["name"] for o in (await store.list(IP_PREFIX)).items] == ["10.43.0.1"]


@pytest.mark.parametrize(("listen", "want"), [("127.0.0.1", "127.0.0.1"), ("192.0.2.5", "192.0.2.5"),
                                              ("localhost", "127.0.0.1")])
def test_default_advertise_address(listen, want):
    from fleet.server.systemsvc import default_advertise_address

    assert default_advertise_address(listen) == want


def test_default_advertise_address_on_all_addresses_is_a_real_one():
    import ipaddress

    from fleet.server.systemsvc import default_advertise_address

    addr = ipaddress.ip_address(default_advertise_address("0.0.0.0"))
    assert addr.version == 4 and not addr.is_unspecified
