"""Cluster DNS wiring decisions: bind/upstream flags, loop avoidance, kube-dns objects."""

from __future__ import annotations

import pytest

from fleet.network.cluster_dns import (
    ClusterDNSConfig,
    advertised_address,
    kube_dns_spec,
    upstreams_for,
)
from fleet.network.dns import parse_bind
from fleet.network.dns_forward import Upstream

PORTS = [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 10053},
         {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 10053}]


def test_parse_bind() -> None:
    assert parse_bind("0.0.0.0:10053") == ("0.0.0.0", 10053)
    assert parse_bind("[::]:53") == ("::", 53)
    assert parse_bind("127.0.0.1") == ("127.0.0.1", 53)
    for bad in ("localhost:53", "1.2.3.4:70000", "[::1:53", "x"):
        with pytest.raises(ValueError):
            parse_bind(bad)


def test_validate_flags() -> None:
    ClusterDNSConfig().validate()
    for cfg in (ClusterDNSConfig(bind="nope"), ClusterDNSConfig(bind="127.0.0.1:0"),
                ClusterDNSConfig(upstreams=["dns.example"]),
                ClusterDNSConfig(pod_records="maybe")):
        with pytest.raises(ValueError):
            cfg.validate()
    ClusterDNSConfig(bind="").validate()  # off


def test_upstreams_skip_ourselves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc = tmp_path / "resolv.conf"
    rc.write_text("nameserver 10.43.0.10\nnameserver 127.0.0.1\nnameserver 192.0.2.53\n")
    cfg = ClusterDNSConfig(resolv_conf=str(rc))
    # The node's resolv.conf may point at the cluster DNS itself: never forward there.
    assert upstreams_for(cfg, ("0.0.0.0", 53)) == [Upstream("192.0.2.53")]
    assert upstreams_for(cfg, ("127.0.0.1", 10053)) == [Upstream("127.0.0.1"), Upstream("192.0.2.53")]
    explicit = ClusterDNSConfig(upstreams=["127.0.0.1:5353"], resolv_conf=str(rc))
    assert upstreams_for(explicit, ("127.0.0.1", 10053)) == [Upstream("127.0.0.1", 5353)]
    assert upstreams_for(ClusterDNSConfig(resolv_conf=str(tmp_path / "missing")), ("0.0.0.0", 53)) == []


def test_advertised_address() -> None:
    assert advertised_address(ClusterDNSConfig(advertise="192.0.2.4"), "0.0.0.0") == "192.0.2.4"
    assert advertised_address(ClusterDNSConfig(), "127.0.0.1") == "127.0.0.1"
    from fleet.server.systemsvc import default_advertise_address

    # A wildcard bind: the server's own address unless it is loopback, else the
    # default-route interface's.
    assert advertised_address(ClusterDNSConfig(), "0.0.0.0", "198.18.0.254") == "198.18.0.254"
    for server in ("", "127.0.0.1", "0.0.0.0"):
        assert advertised_address(ClusterDNSConfig(), "0.0.0.0", server) == \
            default_advertise_address("0.0.0.0")


def test_kube_dns_spec() -> None:
    spec = kube_dns_spec(ClusterDNSConfig(bind="192.0.2.4:10053"))
    assert spec == {"namespace": "kube-system", "name": "kube-dns", "cluster_ip": "10.43.0.10",
                    "ports": PORTS, "endpoint_ips": ["192.0.2.4"],
                    "endpoint_ports": [{"name": "dns", "port": 10053, "protocol": "UDP"},
                                       {"name": "dns-tcp", "port": 10053, "protocol": "TCP"}],
                    "labels": {"k8s-app": "kube-dns"}}
    assert kube_dns_spec(ClusterDNSConfig(advertise="192.0.2.9"))["endpoint_ips"] == ["192.0.2.9"]


def test_client_filter() -> None:
    from fleet.network.dns import ClientFilter

    f = ClientFilter()
    for ok in ("127.0.0.1", "10.42.3.4", "192.168.1.1", "::1", "fd00::5", "::ffff:10.1.2.3", "fe80::1%eth0"):
        assert f.allowed(ok), ok
    for bad in ("8.8.8.8", "203.0.113.9", "2001:db8::1", "::ffff:8.8.8.8", "junk"):
        assert not f.allowed(bad), bad
    assert ClusterDNSConfig(allow=["*"]).client_filter() is None
    assert ClusterDNSConfig(allow=["192.0.2.0/24"]).client_filter().allowed("192.0.2.7")  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        ClusterDNSConfig(allow=["not-a-net"]).validate()


async def test_listeners_drop_clients_outside_the_allowed_networks() -> None:
    import socket as s

    import dnslib
    import trio

    from fleet.network.dns import ClientFilter, DNSHandler, serve
    from fleet.network.dns_records import ClusterRecords

    records = ClusterRecords()
    records.set_service({"metadata": {"namespace": "a", "name": "b"}, "spec": {"clusterIP": "10.43.0.9"}})
    q = bytes(dnslib.DNSRecord.question("b.a.svc.cluster.local").pack())
    for networks, answered in ((["192.0.2.0/24"], False), (["127.0.0.0/8"], True)):
        handler = DNSHandler(records, clients=ClientFilter(networks))
        async with trio.open_nursery() as n:
            _, port = await n.start(serve, handler, "127.0.0.1", 0)
            sock = trio.socket.socket(s.AF_INET, s.SOCK_DGRAM)
            with sock:
                await sock.sendto(q, ("127.0.0.1", port))
                with trio.move_on_after(0.5):
                    data = await sock.recv(512)
                    assert answered and dnslib.DNSRecord.parse(data).rr
                    n.cancel_scope.cancel()
            assert answered is False or n.cancel_scope.cancel_called
            assert handler.stats.dropped_clients == (0 if answered else 1)
            n.cancel_scope.cancel()
