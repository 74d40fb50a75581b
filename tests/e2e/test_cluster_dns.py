"""Cluster DNS served by `fleet server` (fleet/network/cluster_dns.py), end to end.

A real `fleet server --no-agent` with its DNS listener on a loopback port and, as its
only upstream, a tiny dnslib resolver this module runs on loopback.  Services and
EndpointSlices are created through the API; questions go over UDP and TCP with
dnslib's client (and busybox nslookup when it is there).  Only 127.0.0.1 is used.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import FleetServer, ServerFactory, create_namespace, free_port
from tests.e2e.helpers import wait_until

dnslib = pytest.importorskip("dnslib")

NS = "fs-dns"


class Upstream:
    """A loopback resolver: `*.fs-up.test` A 192.0.2.1, `big.fs-up.test` 60 TXT records
    (truncated over UDP), anything else NXDOMAIN with a SOA.  Counts questions."""

    def __init__(self) -> None:
        self.port = free_port()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", self.port))
        self.tcp.listen(8)
        self.questions: list[tuple[str, str, str]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._serve_udp, daemon=True),
                        threading.Thread(target=self._serve_tcp, daemon=True)]
        for t in self.threads:
            t.start()

    def answer(self, data: bytes, transport: str) -> bytes:
        q = dnslib.DNSRecord.parse(data)
        name = str(q.q.qname).lower()
        self.questions.append((name, dnslib.QTYPE[q.q.qtype], transport))
        r = q.reply()
        if name == "big.fs-up.test.":
            for i in range(60):
                r.add_answer(dnslib.RR(q.q.qname, dnslib.QTYPE.TXT, ttl=300,
                                       rdata=dnslib.TXT(f"record number {i:04d} of a long answer")))
            if transport == "udp":
                r = q.reply()
                r.header.tc = 1
        elif name.endswith(".fs-up.test.") and q.q.qtype == dnslib.QTYPE.A:
            r.add_answer(dnslib.RR(q.q.qname, dnslib.QTYPE.A, ttl=300, rdata=dnslib.A("192.0.2.1")))
        else:
            r.header.rcode = dnslib.RCODE.NXDOMAIN
            r.add_auth(dnslib.RR("fs-up.test.", dnslib.QTYPE.SOA, ttl=60,
                                 rdata=dnslib.SOA("ns.fs-up.test.", "h.fs-up.test.",
                                                  (1, 60, 60, 60, 30))))
        return bytes(r.pack())

    def _serve_udp(self) -> None:
        self.udp.settimeout(0.2)
        while not self.stop.is_set():
            try:
                data, addr = self.udp.recvfrom(4096)
            except OSError:
                continue
            self.udp.sendto(self.answer(data, "udp"), addr)

    def _serve_tcp(self) -> None:
        self.tcp.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                n = int.from_bytes(conn.recv(2), "big")
                data = b""
                while len(data) < n:
                    data += conn.recv(n - len(data))
                out = self.answer(data, "tcp")
                conn.sendall(len(out).to_bytes(2, "big") + out)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=2)
        self.udp.close()
        self.tcp.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    try:
        yield up
    finally:
        up.close()


@pytest.fixture(scope="module")
def dns(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetServer, int]]:
    port = free_port()
    factory = ServerFactory(tmp_path_factory.mktemp("fs-dns"))
    try:
        srv = factory.start(extra_args=["--cluster-dns-bind", f"127.0.0.1:{port}",
                                        "--dns-upstream", f"127.0.0.1:{upstream.port}"])
        create_namespace(srv, NS)
        _populate(srv)
        yield srv, port
    finally:
        problems = factory.stop_all()
        assert not problems, problems


def _post(srv: FleetServer, path: str, obj: dict[str, Any]) -> None:
    with srv.client() as c:
        r = c.post(path, json=obj)
    assert r.status_code == 201, (r.status_code, r.text)


def _service(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def _slice(name: str, service: str, endpoints: list[dict[str, Any]],
           ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": endpoints, "ports": ports}


SVC_PATH = f"/api/v1/namespaces/{NS}/services"
SLICE_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def _populate(srv: FleetServer) -> None:
    _post(srv, SVC_PATH, _service("web", {
        "clusterIP": "10.43.77.7", "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}))
    _post(srv, SVC_PATH, _service("db", {
        "clusterIP": "None", "selector": {"app": "db"},
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}))
    _post(srv, SLICE_PATH, _slice("db-1", "db", [
        {"addresses": ["10.42.1.10"], "hostname": "db-0", "conditions": {"ready": True}},
        {"addresses": ["10.42.2.11"], "hostname": "db-1", "conditions": {"ready": True}},
        {"addresses": ["10.42.3.12"], "hostname": "db-2", "conditions": {"ready": False}}],
        [{"name": "pg", "port": 5432, "protocol": "TCP"}]))
    _post(srv, SVC_PATH, _service("ext", {"type": "ExternalName", "externalName": "www.fs-up.test"}))
    # 40 ready endpoints: the A answer is past 512 bytes.
    _post(srv, SVC_PATH, _service("many", {"clusterIP": "None", "selector": {"app": "many"},
                                           "ports": [{"name": "x", "port": 1}]}))
    _post(srv, SLICE_PATH, _slice("many-1", "many", [
        {"addresses": [f"10.42.9.{i}"], "conditions": {"ready": True}} for i in range(1, 41)],
        [{"name": "x", "port": 1, "protocol": "TCP"}]))


def ask(port: int, name: str, qtype: str = "A", *, tcp: bool = False, edns: int | None = None
        ) -> Any:
    q = dnslib.DNSRecord.question(name, qtype)
    if edns is not None:
        q.add_ar(dnslib.EDNS0(udp_len=edns))
    return dnslib.DNSRecord.parse(q.send("127.0.0.1", port, tcp=tcp, timeout=5))


def answered(port: int, name: str, qtype: str = "A", **kw: Any) -> Any:
    """The answer once it has records (the informers may still be catching up)."""
    def attempt() -> Any:
        try:
            r = ask(port, name, qtype, **kw)
        except OSError:
            return None
        return r if r.rr else None
    return wait_until(attempt, timeout=30, what=f"{qtype} {name}")


def rdata(r: Any, qtype: str | None = None) -> list[str]:
    return sorted(str(x.rdata) for x in r.rr if qtype is None or dnslib.QTYPE[x.rtype] == qtype)


def test_service_a_srv_ptr(dns: tuple[FleetServer, int]) -> None:
    _, port = dns
    r = answered(port, f"web.{NS}.svc.cluster.local")
    assert rdata(r) == ["10.43.77.7"] and r.header.aa == 1 and r.rr[0].ttl == 5
    # Case-insensitive, the question's spelling in the answer.
    r = answered(port, f"WEB.{NS.upper()}.svc.Cluster.Local")
    assert str(r.rr[0].rname) == f"WEB.{NS.upper()}.svc.Cluster.Local."
    r = answered(port, f"_http._tcp.web.{NS}.svc.cluster.local", "SRV")
    assert rdata(r) == [f"0 100 80 web.{NS}.svc.cluster.local."]
    r = answered(port, "7.77.43.10.in-addr.arpa", "PTR")
    assert rdata(r) == [f"web.{NS}.svc.cluster.local."]
    # NXDOMAIN and NODATA, both with the SOA.
    r = ask(port, f"nope.{NS}.svc.cluster.local")
    assert r.header.rcode == dnslib.RCODE.NXDOMAIN and r.auth[0].rtype == dnslib.QTYPE.SOA
    r = ask(port, f"web.{NS}.svc.cluster.local", "AAAA")
    assert r.header.rcode == 0 and not r.rr and r.auth[0].rtype == dnslib.QTYPE.SOA


def test_headless_and_statefulset_names(dns: tuple[FleetServer, int]) -> None:
    _, port = dns
    r = answered(port, f"db.{NS}.svc.cluster.local")
    assert rdata(r) == ["10.42.1.10", "10.42.2.11"]  # db-2 is not ready
    assert rdata(answered(port, f"db-1.db.{NS}.svc.cluster.local")) == ["10.42.2.11"]
    assert ask(port, f"db-2.db.{NS}.svc.cluster.local").header.rcode == dnslib.RCODE.NXDOMAIN
    r = answered(port, f"_pg._tcp.db.{NS}.svc.cluster.local", "SRV")
    assert rdata(r) == [f"0 50 5432 db-0.db.{NS}.svc.cluster.local.",
                        f"0 50 5432 db-1.db.{NS}.svc.cluster.local."]
    assert sorted(str(a.rdata) for a in r.ar if a.rtype == dnslib.QTYPE.A) == ["10.42.1.10", "10.42.2.11"]
    assert rdata(answered(port, "10.1.42.10.in-addr.arpa", "PTR")) == [f"db-0.db.{NS}.svc.cluster.local."]
    assert rdata(answered(port, f"10-42-0-9.{NS}.pod.cluster.local")) == ["10.42.0.9"]


def test_external_name_and_forwarding(dns: tuple[FleetServer, int], upstream: Upstream) -> None:
    _, port = dns
    r = answered(port, f"ext.{NS}.svc.cluster.local")
    assert [(dnslib.QTYPE[x.rtype], str(x.rdata)) for x in r.rr] == [
        ("CNAME", "www.fs-up.test."), ("A", "192.0.2.1")]
    r = answered(port, "api.fs-up.test")
    assert rdata(r) == ["192.0.2.1"] and r.header.ra == 1
    before = len(upstream.questions)
    r = answered(port, "api.fs-up.test")  # from the cache, TTL counting down
    assert len(upstream.questions) == before and 0 < r.rr[0].ttl <= 300
    r = ask(port, "missing.fs-none.test")
    assert r.header.rcode == dnslib.RCODE.NXDOMAIN
    n = len(upstream.questions)
    assert ask(port, "missing.fs-none.test").header.rcode == dnslib.RCODE.NXDOMAIN
    assert len(upstream.questions) == n  # negative answers are cached too
    # A truncated upstream answer is asked again over TCP; our UDP answer is then
    # truncated in turn, and TCP gets it all.
    r = ask(port, "big.fs-up.test", "TXT")
    assert r.header.tc == 1
    assert ("big.fs-up.test.", "TXT", "tcp") in upstream.questions
    assert len(ask(port, "big.fs-up.test", "TXT", tcp=True).rr) == 60


def test_tcp_and_truncation(dns: tuple[FleetServer, int]) -> None:
    _, port = dns
    name = f"many.{NS}.svc.cluster.local"
    r = answered(port, name, tcp=True)
    assert len(r.rr) == 40
    udp = ask(port, name)
    assert udp.header.tc == 1 and not udp.rr
    assert len(answered(port, name, edns=4096).rr) == 40  # EDNS: room enough over UDP
    assert rdata(answered(port, f"web.{NS}.svc.cluster.local", tcp=True)) == ["10.43.77.7"]


def test_malformed_queries_get_formerr_and_the_server_keeps_answering(dns: tuple[FleetServer, int]) -> None:
    _, port = dns
    answered(port, f"web.{NS}.svc.cluster.local")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xff\xfe\xfd", ("127.0.0.1", port))
        r = dnslib.DNSRecord.parse(s.recv(512))
        assert r.header.id == 0x1234 and r.header.rcode == dnslib.RCODE.FORMERR
        s.sendto(b"\x01", ("127.0.0.1", port))  # not even a header: dropped
        for junk in (b"\x00" * 12 + b"\xc0\x0c" * 50, bytes(range(256)), b"\xab\xcd" + b"\xff" * 40):
            s.sendto(junk, ("127.0.0.1", port))
    # Garbage over TCP: a length prefix promising more than is sent, then a close.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"\x00\x40garbage")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"\x00\x0f\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xff\xfe\xfd")
        head = c.recv(2)
        body = c.recv(int.from_bytes(head, "big"))
        assert dnslib.DNSRecord.parse(body).header.rcode == dnslib.RCODE.FORMERR
    assert rdata(answered(port, f"web.{NS}.svc.cluster.local")) == ["10.43.77.7"]


def test_kube_dns_service_and_metrics(dns: tuple[FleetServer, int]) -> None:
    srv, port = dns

    def endpoints() -> Any:
        with srv.client() as c:
            r = c.get("/api/v1/namespaces/kube-system/endpoints/kube-dns")
        return r.json() if r.status_code == 200 else None

    ep = wait_until(endpoints, timeout=30, what="kube-dns Endpoints")
    assert ep["subsets"][0]["addresses"] == [{"ip": "127.0.0.1"}]
    assert sorted((p["name"], p["port"], p["protocol"]) for p in ep["subsets"][0]["ports"]) == [
        ("dns", port, "UDP"), ("dns-tcp", port, "TCP")]
    with srv.client() as c:
        svc = c.get("/api/v1/namespaces/kube-system/services/kube-dns").json()
    assert svc["spec"]["clusterIP"] == "10.43.0.10"
    assert svc["metadata"]["labels"]["k8s-app"] == "kube-dns"
    assert "selector" not in svc["spec"]
    assert sorted((p["name"], p["port"], p["protocol"], p["targetPort"]) for p in svc["spec"]["ports"]) == [
        ("dns", 53, "UDP", port), ("dns-tcp", 53, "TCP", port)]
    assert rdata(answered(port, "kube-dns.kube-system.svc.cluster.local")) == ["10.43.0.10"]
    text = httpx.get(srv.metrics_url, timeout=10).text
    assert 'fleet_dns_responses_total{rcode="NOERROR"}' in text
    assert "fleet_dns_forward_cache_hits_total" in text


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed")
def test_busybox_nslookup(dns: tuple[FleetServer, int]) -> None:
    _, port = dns
    answered(port, f"web.{NS}.svc.cluster.local")
    deadline = time.monotonic() + 20
    while True:
        p = subprocess.run(["busybox", "nslookup", f"web.{NS}.svc.cluster.local", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=20)
        if "10.43.77.7" in p.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "10.43.77.7" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("args,message", [
    (["--cluster-dns-bind", "dns.example:53"], "not an IP address"),
    (["--dns-upstream", "resolver.example"], "not an IP address"),
    (["--cluster-dns-allow", "everyone"], "--cluster-dns-allow"),
    (["--cluster-dns-ttl", "-1"], "TTL"),
    (["--cluster-dns-pods", "sometimes"], "pod records mode"),
])
def test_bad_dns_flags_stop_the_server_with_a_clear_error(tmp_path: Any, args: list[str],
                                                          message: str) -> None:
    import sys

    from tests.conftest import _server_env

    p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "server", "--data-dir", str(tmp_path),
                        "--port", str(free_port()), "--metrics-port", str(free_port()), "--no-agent",
                        *args], capture_output=True, text=True, timeout=60, env=_server_env())
    out = p.stdout + p.stderr
    assert p.returncode != 0 and message in out and "Traceback" not in out, out


def test_verified_pod_records(tmp_path_factory: pytest.TempPathFactory) -> None:
    port = free_port()
    factory = ServerFactory(tmp_path_factory.mktemp("fs-dns-verified"))
    try:
        srv = factory.start(extra_args=["--cluster-dns-bind", f"127.0.0.1:{port}",
                                        "--cluster-dns-pods", "verified", "--dns-upstream", "127.0.0.1:9"])
        create_namespace(srv, NS)
        name = f"10-42-0-33.{NS}.pod.cluster.local"
        def rcode() -> int | None:
            try:
                return int(ask(port, name).header.rcode)
            except OSError:  # not listening yet
                return None
        wait_until(lambda: rcode() == dnslib.RCODE.NXDOMAIN, timeout=30,
                   what="an NXDOMAIN for a pod IP no pod has")
        _post(srv, f"/api/v1/namespaces/{NS}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        with srv.client() as c:
            r = c.patch(f"/api/v1/namespaces/{NS}/pods/p/status",
                        json={"status": {"podIP": "10.42.0.33", "podIPs": [{"ip": "10.42.0.33"}]}},
                        headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        assert rdata(answered(port, name)) == ["10.42.0.33"]
        assert ask(port, "10-42-0-33.default.pod.cluster.local").header.rcode == dnslib.RCODE.NXDOMAIN
    finally:
        problems = factory.stop_all()
        assert not problems, problems
