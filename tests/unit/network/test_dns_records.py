"""The cluster DNS record engine (fleet/network/dns_records.py), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.network.dns_records import (
    NOERROR,
    NXDOMAIN,
    ClusterRecords,
    dashed,
    reverse_ip,
    undash,
)


def svc(ns: str, name: str, cluster_ip: str | None = None, ports: list[dict[str, Any]] | None = None,
        **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"ports": ports or [], **spec}
    if cluster_ip is not None:
        s["clusterIP"] = cluster_ip
        s["clusterIPs"] = [cluster_ip]
    return {"metadata": {"namespace": ns, "name": name}, "spec": s}


def eps(ns: str, name: str, service: str, endpoints: list[dict[str, Any]],
        ports: list[dict[str, Any]] | None = None, address_type: str = "IPv4") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": address_type, "endpoints": endpoints, "ports": ports or []}


def ep(ip: str, hostname: str | None = None, ready: bool | None = True) -> dict[str, Any]:
    e: dict[str, Any] = {"addresses": [ip]}
    if ready is not None:
        e["conditions"] = {"ready": ready}
    if hostname:
        e["hostname"] = hostname
    return e


def make_records() -> ClusterRecords:
    """The records every table case is asked of (shared with test_dns_wire)."""
    r = ClusterRecords()
    r.set_namespace("default")
    r.set_namespace("fs-ns")
    r.set_service(svc("default", "kubernetes", "10.43.0.1",
                      [{"name": "https", "port": 443, "protocol": "TCP"}]))
    r.set_service(svc("fs-ns", "web", "10.43.5.6",
                      [{"name": "http", "port": 80, "protocol": "TCP"},
                       {"name": "dns", "port": 53, "protocol": "UDP"},
                       {"port": 8080, "protocol": "TCP"}]))
    r.set_service(svc("fs-ns", "v6", "fd00::10", [{"name": "http", "port": 80}]))
    r.set_service(svc("fs-ns", "db", "None", [{"name": "pg", "port": 5432}]))
    r.set_slice(eps("fs-ns", "db-abc", "db",
                    [ep("10.42.0.5", "db-0"), ep("10.42.1.7", "db-1"), ep("10.42.2.9"),
                     ep("10.42.3.3", "db-3", ready=False), ep("10.42.4.4", "db-4", ready=None)],
                    [{"name": "pg", "port": 5433, "protocol": "TCP"}]))
    r.set_service(svc("fs-ns", "empty", "None"))
    r.set_service(svc("fs-ns", "ext", None, type="ExternalName", externalName="www.example.com"))
    r.set_service(svc("fs-ns", "alias", None, type="ExternalName",
                      externalName="web.fs-ns.svc.cluster.local"))
    r.set_service(svc("fs-ns", "pending", None, [{"name": "http", "port": 80}]))
    return r


@pytest.fixture
def records() -> ClusterRecords:
    return make_records()


def rrs(a: Any) -> list[tuple[str, str, tuple[Any, ...]]]:
    return [(r.name, r.rtype, r.data) for r in a.answer]


CASES = [
    # (qname, qtype, rcode, answers [(rtype, data)], soa in authority)
    ("web.fs-ns.svc.cluster.local", "A", NOERROR, [("A", ("10.43.5.6",))], False),
    ("WEB.Fs-Ns.SVC.Cluster.Local.", "A", NOERROR, [("A", ("10.43.5.6",))], False),
    ("web.fs-ns.svc.cluster.local", "AAAA", NOERROR, [], True),
    ("web.fs-ns.svc.cluster.local", "TXT", NOERROR, [], True),
    ("v6.fs-ns.svc.cluster.local", "AAAA", NOERROR, [("AAAA", ("fd00::10",))], False),
    ("v6.fs-ns.svc.cluster.local", "A", NOERROR, [], True),
    ("nope.fs-ns.svc.cluster.local", "A", NXDOMAIN, [], True),
    ("web.other.svc.cluster.local", "A", NXDOMAIN, [], True),
    ("fs-ns.svc.cluster.local", "A", NOERROR, [], True),
    ("nons.svc.cluster.local", "A", NXDOMAIN, [], True),
    ("svc.cluster.local", "A", NOERROR, [], True),
    ("cluster.local", "SOA", NOERROR, [("SOA", None)], False),
    ("cluster.local", "NS", NOERROR, [("NS", ("ns.dns.cluster.local.",))], False),
    ("cluster.local", "A", NOERROR, [], True),
    ("what.cluster.local", "A", NXDOMAIN, [], True),
    ("dns-version.cluster.local", "TXT", NOERROR, [("TXT", ("1.1.0",))], False),
    # SRV: named ports of a ClusterIP Service → the Service's name.
    ("_http._tcp.web.fs-ns.svc.cluster.local", "SRV", NOERROR,
     [("SRV", (0, 100, 80, "web.fs-ns.svc.cluster.local."))], False),
    ("_dns._udp.web.fs-ns.svc.cluster.local", "SRV", NOERROR,
     [("SRV", (0, 100, 53, "web.fs-ns.svc.cluster.local."))], False),
    ("_dns._tcp.web.fs-ns.svc.cluster.local", "SRV", NXDOMAIN, [], True),
    ("_nope._tcp.web.fs-ns.svc.cluster.local", "SRV", NXDOMAIN, [], True),
    ("_http._tcp.web.fs-ns.svc.cluster.local", "A", NOERROR, [], True),
    ("_tcp.web.fs-ns.svc.cluster.local", "SRV", NOERROR, [], True),
    ("_sctp.web.fs-ns.svc.cluster.local", "SRV", NXDOMAIN, [], True),
    # Headless: ready endpoints only (a nil ready is ready), hostnames, dashed IPs.
    ("db.fs-ns.svc.cluster.local", "A", NOERROR,
     [("A", ("10.42.0.5",)), ("A", ("10.42.1.7",)), ("A", ("10.42.2.9",)), ("A", ("10.42.4.4",))],
     False),
    ("db-0.db.fs-ns.svc.cluster.local", "A", NOERROR, [("A", ("10.42.0.5",))], False),
    ("DB-1.db.fs-ns.svc.cluster.local", "A", NOERROR, [("A", ("10.42.1.7",))], False),
    ("10-42-2-9.db.fs-ns.svc.cluster.local", "A", NOERROR, [("A", ("10.42.2.9",))], False),
    ("db-3.db.fs-ns.svc.cluster.local", "A", NXDOMAIN, [], True),
    ("db-0.db.fs-ns.svc.cluster.local", "AAAA", NOERROR, [], True),
    ("db-0.web.fs-ns.svc.cluster.local", "A", NXDOMAIN, [], True),
    ("_pg._tcp.db.fs-ns.svc.cluster.local", "SRV", NOERROR,
     [("SRV", (0, 25, 5433, "db-0.db.fs-ns.svc.cluster.local.")),
      ("SRV", (0, 25, 5433, "db-1.db.fs-ns.svc.cluster.local.")),
      ("SRV", (0, 25, 5433, "10-42-2-9.db.fs-ns.svc.cluster.local.")),
      ("SRV", (0, 25, 5433, "db-4.db.fs-ns.svc.cluster.local."))], False),
    ("empty.fs-ns.svc.cluster.local", "A", NXDOMAIN, [], True),
    ("pending.fs-ns.svc.cluster.local", "A", NOERROR, [], True),
    # ExternalName: a CNAME; an in-cluster target is followed.
    ("ext.fs-ns.svc.cluster.local", "CNAME", NOERROR, [("CNAME", ("www.example.com.",))], False),
    ("alias.fs-ns.svc.cluster.local", "A", NOERROR,
     [("CNAME", ("web.fs-ns.svc.cluster.local.",)), ("A", ("10.43.5.6",))], False),
    # Pod records (insecure mode: any IP).
    ("10-42-0-99.fs-ns.pod.cluster.local", "A", NOERROR, [("A", ("10.42.0.99",))], False),
    ("fd00--1.fs-ns.pod.cluster.local", "AAAA", NOERROR, [("AAAA", ("fd00::1",))], False),
    ("10-42-0-99.fs-ns.pod.cluster.local", "AAAA", NOERROR, [], True),
    ("not-an-ip.fs-ns.pod.cluster.local", "A", NXDOMAIN, [], True),
    ("10-42-0.fs-ns.pod.cluster.local", "A", NXDOMAIN, [], True),
    ("pod.cluster.local", "A", NOERROR, [], True),
    # PTR: ClusterIPs and headless endpoints.
    ("6.5.43.10.in-addr.arpa", "PTR", NOERROR, [("PTR", ("web.fs-ns.svc.cluster.local.",))], False),
    ("5.0.42.10.in-addr.arpa.", "PTR", NOERROR,
     [("PTR", ("db-0.db.fs-ns.svc.cluster.local.",))], False),
    ("9.2.42.10.in-addr.arpa.", "PTR", NOERROR,
     [("PTR", ("10-42-2-9.db.fs-ns.svc.cluster.local.",))], False),
    ("0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa", "PTR", NOERROR,
     [("PTR", ("v6.fs-ns.svc.cluster.local.",))], False),
]


@pytest.mark.parametrize("qname,qtype,rcode,answers,soa", CASES,
                         ids=[f"{c[1]}-{c[0]}" for c in CASES])
def test_answers(records: ClusterRecords, qname: str, qtype: str, rcode: int,
                 answers: list[tuple[str, Any]], soa: bool) -> None:
    a = records.answer(qname, qtype)
    assert not a.forward
    assert a.rcode == rcode
    got = [(r.rtype, r.data if expected[1] is not None else None)
           for r, expected in zip(a.answer, answers, strict=False)]
    assert got == answers
    assert len(a.answer) == len(answers)
    # Answers carry the question's name as asked (with a trailing dot).
    for r in a.answer[:1]:
        assert r.name == (qname if qname.endswith(".") else qname + ".")
    assert bool(a.authority and a.authority[0].rtype == "SOA") == soa
    assert all(r.ttl == 5 for r in a.answer)


def test_outside_names_are_forwarded(records: ClusterRecords) -> None:
    for q, t in (("example.com", "A"), ("cluster.local.example.com", "A"),
                 ("1.0.0.127.in-addr.arpa", "PTR"), ("local", "SOA")):
        assert records.answer(q, t).forward, q


def test_external_name_outside_is_chased(records: ClusterRecords) -> None:
    a = records.answer("ext.fs-ns.svc.cluster.local", "A")
    assert rrs(a) == [("ext.fs-ns.svc.cluster.local.", "CNAME", ("www.example.com.",))]
    assert a.chase == "www.example.com."


def test_srv_additional_has_target_addresses(records: ClusterRecords) -> None:
    a = records.answer("_pg._tcp.db.fs-ns.svc.cluster.local", "SRV")
    assert {(r.name, r.data[0]) for r in a.additional} == {
        ("db-0.db.fs-ns.svc.cluster.local.", "10.42.0.5"),
        ("db-1.db.fs-ns.svc.cluster.local.", "10.42.1.7"),
        ("10-42-2-9.db.fs-ns.svc.cluster.local.", "10.42.2.9"),
        ("db-4.db.fs-ns.svc.cluster.local.", "10.42.4.4")}


def test_updates_and_deletes_move_records(records: ClusterRecords) -> None:
    g = records.generation
    # A slice turns an endpoint unready; another slice of the same Service adds one.
    records.set_slice(eps("fs-ns", "db-abc", "db", [ep("10.42.0.5", "db-0", ready=False)],
                          [{"name": "pg", "port": 5433}]))
    records.set_slice(eps("fs-ns", "db-def", "db", [ep("10.42.9.9", "db-9")],
                          [{"name": "pg", "port": 5433}]))
    assert records.generation > g
    assert rrs(records.answer("db.fs-ns.svc.cluster.local", "A")) == [
        ("db.fs-ns.svc.cluster.local.", "A", ("10.42.9.9",))]
    assert records.answer("5.0.42.10.in-addr.arpa", "PTR").forward
    records.delete_slice("fs-ns", "db-def")
    assert records.answer("db.fs-ns.svc.cluster.local", "A").rcode == NXDOMAIN
    records.delete_service("fs-ns", "web")
    assert records.answer("web.fs-ns.svc.cluster.local", "A").rcode == NXDOMAIN
    assert records.answer("6.5.43.10.in-addr.arpa", "PTR").forward
    # The namespace still exists (NODATA), one without object nor Services does not.
    assert records.answer("fs-ns.svc.cluster.local", "A").rcode == NOERROR
    records.delete_namespace("default")
    assert records.answer("default.svc.cluster.local", "A").rcode == NOERROR  # a Service left
    records.delete_service("default", "kubernetes")
    assert records.answer("default.svc.cluster.local", "A").rcode == NXDOMAIN


def test_slice_arriving_before_its_service(records: ClusterRecords) -> None:
    records.set_slice(eps("fs-ns", "late-1", "late", [ep("10.42.7.7", "late-0")]))
    assert records.answer("late.fs-ns.svc.cluster.local", "A").rcode == NXDOMAIN
    records.set_service(svc("fs-ns", "late", "None"))
    assert rrs(records.answer("late-0.late.fs-ns.svc.cluster.local", "A"))[0][2] == ("10.42.7.7",)


def test_verified_and_disabled_pod_records() -> None:
    r = ClusterRecords(pod_mode="verified")
    r.set_namespace("fs-ns")
    q = "10-42-0-8.fs-ns.pod.cluster.local"
    assert r.answer(q, "A").rcode == NXDOMAIN
    r.set_pod({"metadata": {"namespace": "fs-ns", "name": "p"},
               "status": {"podIP": "10.42.0.8", "podIPs": [{"ip": "10.42.0.8"}]}})
    assert rrs(r.answer(q, "A")) == [(q + ".", "A", ("10.42.0.8",))]
    assert r.answer("10-42-0-8.other.pod.cluster.local", "A").rcode == NXDOMAIN
    r.delete_pod("fs-ns", "p")
    assert r.answer(q, "A").rcode == NXDOMAIN
    d = ClusterRecords(pod_mode="disabled")
    assert d.answer(q, "A").rcode == NXDOMAIN
    with pytest.raises(ValueError):
        ClusterRecords(pod_mode="sometimes")


def test_custom_zone_and_ttl() -> None:
    r = ClusterRecords(zone="Corp.Example.", ttl=30)
    r.set_service(svc("a", "b", "10.43.0.2"))
    a = r.answer("b.a.svc.corp.example", "A")
    assert rrs(a) == [("b.a.svc.corp.example.", "A", ("10.43.0.2",))] and a.answer[0].ttl == 30
    assert r.answer("b.a.svc.cluster.local", "A").forward


def test_name_helpers() -> None:
    assert dashed("10.1.2.3") == "10-1-2-3" and dashed("fd00::1") == "fd00--1"
    assert undash("10-1-2-3") == "10.1.2.3" and undash("fd00--1") == "fd00::1"
    assert undash("1-2-3") is None and undash("web-0") is None
    assert reverse_ip("4.3.2.1.in-addr.arpa") == "1.2.3.4"
    assert reverse_ip("3.2.1.in-addr.arpa") is None
    assert reverse_ip("x.3.2.1.in-addr.arpa") is None


def test_malformed_objects_have_no_records_and_break_nothing(records: ClusterRecords) -> None:
    records.set_service({"metadata": {"namespace": "fs-ns", "name": "odd"},
                         "spec": {"clusterIP": "None", "clusterIPs": "nope", "ports": "80"}})
    records.set_service({"metadata": {"namespace": "fs-ns", "name": "odd2"}, "spec": "string"})
    records.set_slice({"metadata": {"namespace": "fs-ns", "name": "odd-1",
                                    "labels": {"kubernetes.io/service-name": "odd"}},
                       "addressType": "IPv4", "ports": [{"name": "p", "port": "80"}, 7],
                       "endpoints": [{"addresses": [5, {"x": 1}, "10.42.5.5"], "conditions": "yes",
                                      "hostname": ["x"]}, "junk"]})
    a = records.answer("odd.fs-ns.svc.cluster.local", "A")
    assert [r.data for r in a.answer] == [("10.42.5.5",)]
    assert records.answer("_p._tcp.odd.fs-ns.svc.cluster.local", "SRV").rcode == NXDOMAIN
    assert records.answer("odd2.fs-ns.svc.cluster.local", "A").rcode == NOERROR
    assert rrs(records.answer("web.fs-ns.svc.cluster.local", "A"))[0][2] == ("10.43.5.6",)


def test_updates_that_change_no_record_keep_the_generation(records: ClusterRecords) -> None:
    g = records.generation
    sl = eps("fs-ns", "db-abc", "db",
             [ep("10.42.0.5", "db-0"), ep("10.42.1.7", "db-1"), ep("10.42.2.9"),
              ep("10.42.3.3", "db-3", ready=False), ep("10.42.4.4", "db-4", ready=None)],
             [{"name": "pg", "port": 5433, "protocol": "TCP"}])
    sl["endpoints"][0]["nodeName"] = "node-2"  # not a DNS record
    records.set_slice(sl)
    records.set_service(svc("fs-ns", "web", "10.43.5.6",
                            [{"name": "http", "port": 80, "protocol": "TCP"},
                             {"name": "dns", "port": 53, "protocol": "UDP"},
                             {"port": 8080, "protocol": "TCP"}], selector={"app": "other"}))
    assert records.generation == g
    sl["endpoints"][0]["conditions"] = {"ready": False}
    records.set_slice(sl)
    assert records.generation > g
