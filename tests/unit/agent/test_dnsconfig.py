"""Pods' resolv.conf, hostname and /etc/hosts by the kubelet's rules (fleet/agent/dnsconfig.py)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.agent.dnsconfig import (
    NodeDNS,
    ResolvConf,
    container_hostname,
    hosts_file,
    merge_options,
    parse_resolv_conf,
    pod_dns,
    pod_hostname,
)

HOST = parse_resolv_conf(
    "# generated\nnameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch old.example\n"
    "search corp.example. lab.example corp.example\noptions edns0 timeout:2\n")
NODE = NodeDNS(("10.43.0.10",), "cluster.local", "/etc/resolv.conf")


def pod(policy: str | None = None, host_network: bool = False, dns_config: Any = None,
        **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = dict(spec)
    if policy:
        s["dnsPolicy"] = policy
    if host_network:
        s["hostNetwork"] = True
    if dns_config is not None:
        s["dnsConfig"] = dns_config
    return {"metadata": {"namespace": "fs-ns", "name": "web-0", "uid": "u1"}, "spec": s}


CLUSTER = ResolvConf(["10.43.0.10"], ["fs-ns.svc.cluster.local", "svc.cluster.local", "cluster.local",
                                      "corp.example", "lab.example"], ["ndots:5"])
DEFAULT = ResolvConf(["192.0.2.53", "192.0.2.54"], ["corp.example", "lab.example"],
                     ["edns0", "timeout:2"])


def test_parse_host_resolv_conf() -> None:
    assert HOST == DEFAULT


@pytest.mark.parametrize("p,node,want,reasons", [
    (pod(), NODE, CLUSTER, []),
    (pod("ClusterFirst"), NODE, CLUSTER, []),
    (pod("ClusterFirst", host_network=True), NODE, DEFAULT, []),
    (pod("ClusterFirstWithHostNet", host_network=True), NODE, CLUSTER, []),
    (pod("ClusterFirstWithHostNet"), NODE, CLUSTER, []),
    (pod("Default"), NODE, DEFAULT, []),
    (pod("None", dns_config={"nameservers": ["1.1.1.1"], "searches": ["a.example"],
                             "options": [{"name": "ndots", "value": "2"}, {"name": "rotate"}]}),
     NODE, ResolvConf(["1.1.1.1"], ["a.example"], ["ndots:2", "rotate"]), []),
    (pod("None"), NODE, ResolvConf(), []),
    # No cluster DNS on this node (no pod networking): Default, with kubelet's Event.
    (pod(), NodeDNS((), "cluster.local"), DEFAULT, ["MissingClusterDNS"]),
    # --resolv-conf="": Default means localhost and the root search.
    (pod("Default"), NodeDNS(resolv_conf=""), ResolvConf(["127.0.0.1"], ["."], []), []),
    # dnsConfig is appended to ClusterFirst; options merged by name.
    (pod(dns_config={"nameservers": ["10.43.0.10", "192.0.2.1"], "searches": ["svc.cluster.local", "x.example"],
                     "options": [{"name": "ndots", "value": "1"}, {"name": "edns0"}]}), NODE,
     ResolvConf(["10.43.0.10", "192.0.2.1"], [*CLUSTER.searches, "x.example"], ["ndots:1", "edns0"]), []),
    # Limits: 3 nameservers.
    (pod(dns_config={"nameservers": ["192.0.2.1", "192.0.2.2", "192.0.2.3"]}), NODE,
     ResolvConf(["10.43.0.10", "192.0.2.1", "192.0.2.2"], CLUSTER.searches, ["ndots:5"]),
     ["DNSConfigForming"]),
], ids=["default-policy", "cluster-first", "hostnet-falls-back", "hostnet-cluster", "with-hostnet-no-hostnet",
        "default", "none", "none-empty", "missing-cluster-dns", "no-host-resolv", "dnsconfig-merge",
        "nameserver-limit"])
def test_pod_dns(p: dict[str, Any], node: NodeDNS, want: ResolvConf, reasons: list[str]) -> None:
    got = pod_dns(p, node, HOST)
    assert got.conf == want
    assert [e[1] for e in got.events] == reasons
    assert all(e[0] == "Warning" for e in got.events)


def test_search_limits() -> None:
    many = [f"d{i:02d}.example" for i in range(40)]
    got = pod_dns(pod("None", dns_config={"searches": many}), NODE, HOST)
    assert got.conf.searches == many[:32] and got.events[0][1] == "DNSConfigForming"
    long = ["x" * 250 + f".e{i}" for i in range(10)]
    got = pod_dns(pod("None", dns_config={"searches": long}), NODE, HOST)
    assert len(" ".join(got.conf.searches)) <= 2048 and got.conf.searches == long[:len(got.conf.searches)]
    assert "the applied search line is" in got.events[0][2]


def test_render() -> None:
    assert CLUSTER.render() == ("nameserver 10.43.0.10\n"
                                "search fs-ns.svc.cluster.local svc.cluster.local cluster.local "
                                "corp.example lab.example\noptions ndots:5\n")
    assert ResolvConf().render() == ""


def test_merge_options() -> None:
    assert merge_options(["ndots:5", "edns0"], [{"name": "ndots", "value": "2"}, {"name": "x"}]) == [
        "ndots:2", "edns0", "x"]


def test_hostname_and_hosts_file() -> None:
    p = pod(hostname="db-0", subdomain="db")
    assert pod_hostname(p, "cluster.local") == ("db-0", "db.fs-ns.svc.cluster.local")
    assert container_hostname(p, "cluster.local") == "db-0"
    p["spec"]["setHostnameAsFQDN"] = True
    assert container_hostname(p, "cluster.local") == "db-0.db.fs-ns.svc.cluster.local"
    text = hosts_file(p, ["10.42.0.7"], "cluster.local")
    assert "10.42.0.7\tdb-0.db.fs-ns.svc.cluster.local\tdb-0\n" in text
    assert text.startswith("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
    plain = pod(hostAliases=[{"ip": "192.0.2.9", "hostnames": ["a.example", "b"]}])
    text = hosts_file(plain, ["10.42.0.8"], "cluster.local")
    assert "10.42.0.8\tweb-0\n" in text and "192.0.2.9\ta.example\tb\n" in text
    longname = {"metadata": {"name": "a" * 62 + "-b" + "c" * 10, "namespace": "n"}, "spec": {}}
    assert pod_hostname(longname, "cluster.local")[0] == "a" * 62
