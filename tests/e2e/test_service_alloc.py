"""Service ClusterIP / NodePort allocation against a real `fleet server`, through kubectl
and plain HTTP: what `kubectl get svc` shows, Kubernetes' refusals, type changes,
500 concurrent creates, a `kill -9` in the middle of creates followed by the repair
loop, the `kubernetes` Service, and ServiceLB's ingress.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.conftest import KUBECTL, FleetServer, ServerFactory, create_namespace
from tests.e2e.helpers import wait_until

pytestmark = [pytest.mark.e2e]

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

CIDR_PREFIX = "10.43."


def svc_body(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("ports", [{"port": 80}])
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def services(srv: FleetServer) -> list[dict[str, Any]]:
    with srv.client(timeout=30) as c:
        r = c.get("/api/v1/services")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def ip_addresses(srv: FleetServer) -> list[dict[str, Any]]:
    with srv.client(timeout=30) as c:
        r = c.get("/apis/networking.k8s.io/v1/ipaddresses")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def allocation_problems(srv: FleetServer) -> list[str]:
    """Every Service with a ClusterIP has its IPAddress pointing back at it, no address is
    held twice, and no IPAddress is left without its Service."""
    svcs = services(srv)
    addrs = {a["metadata"]["name"]: a["spec"]["parentRef"] for a in ip_addresses(srv)}
    problems = []
    held = Counter(s["spec"].get("clusterIP") for s in svcs if s["spec"].get("clusterIP") not in (None, "None"))
    problems += [f"{ip} held by {n} Services" for ip, n in held.items() if n > 1]
    owners = set()
    for s in svcs:
        ip = s["spec"].get("clusterIP")
        if ip in (None, "None"):
            continue
        ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
        owners.add((ip, ns, name))
        ref = addrs.get(ip)
        if ref is None or (ref["namespace"], ref["name"]) != (ns, name):
            problems.append(f"{ns}/{name} ({ip}): IPAddress {ref}")
    for ip, ref in addrs.items():
        if (ip, ref["namespace"], ref["name"]) not in owners:
            problems.append(f"IPAddress {ip} leaked ({ref})")
    return problems


# --------------------------------------------------------------------------- kubectl


@needs_kubectl
def test_kubectl_create_expose_get(fleet_server: FleetServer, namespace: str, kubectl) -> None:
    rc, out, err = kubectl("-n", namespace, "create", "service", "clusterip", "fa-x", "--tcp=80")
    assert rc == 0, err
    # `create` returns the stored object: the address is there at once.
    rc, out, err = kubectl("-n", namespace, "get", "svc", "fa-x", "-o", "jsonpath={.spec.clusterIP}")
    assert rc == 0 and out.startswith(CIDR_PREFIX) and out != "10.43.0.1", (out, err)
    ip = out
    rc, out, err = kubectl("-n", namespace, "create", "deployment", "fa-web", "--image=busybox")
    assert rc == 0, err
    rc, out, err = kubectl("-n", namespace, "expose", "deployment", "fa-web", "--port=80", "--type=NodePort")
    assert rc == 0, err
    rc, out, err = kubectl("-n", namespace, "get", "svc")
    assert rc == 0, err
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines()[1:]}
    assert out.splitlines()[0].split()[:5] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"]
    assert lines["fa-x"][1:4] == ["ClusterIP", ip, "<none>"]
    web = lines["fa-web"]
    assert web[1] == "NodePort" and web[2].startswith(CIDR_PREFIX)
    port = int(web[4].split(":")[1].split("/")[0])
    assert 30000 <= port <= 32767
    rc, out, err = kubectl("get", "ipaddresses", ip)
    assert rc == 0, err
    assert out.split("\n")[0].split() == ["NAME", "PARENTREF"]
    assert out.split("\n")[1].split() == [ip, f"services/{namespace}/fa-x"]


@needs_kubectl
def test_kubernetes_service_and_kinds(fleet_server: FleetServer, kubectl) -> None:
    rc, out, err = kubectl("get", "svc", "kubernetes", "-n", "default")
    assert rc == 0, err
    row = out.splitlines()[1].split()
    assert row[:5] == ["kubernetes", "ClusterIP", "10.43.0.1", "<none>", "443/TCP"]
    rc, out, err = kubectl("get", "endpoints", "kubernetes", "-n", "default", "-o",
                           "jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}")
    assert rc == 0, err
    assert out == f"127.0.0.1:{fleet_server.port}"
    rc, out, err = kubectl("get", "svc", "kubernetes", "-n", "default", "-o",
                           "jsonpath={.spec.ports[0].name}/{.spec.ports[0].targetPort}")
    assert out == f"https/{fleet_server.port}", err
    rc, out, err = kubectl("get", "ipaddresses,servicecidrs")
    assert rc == 0, err
    assert "ipaddress.networking.k8s.io/10.43.0.1" in out and "services/default/kubernetes" in out
    assert "servicecidr.networking.k8s.io/kubernetes" in out and "10.43.0.0/16" in out
    assert "CIDRS" in out and "PARENTREF" in out


@needs_kubectl
def test_duplicates_refused_with_kubernetes_messages(fleet_server: FleetServer, namespace: str, kubectl) -> None:
    def create(name: str, spec: str) -> tuple[int, str, str]:
        return kubectl("-n", namespace, "create", "-f", "-", input=(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {spec}\n"))

    rc, _, err = create("fa-a", "{clusterIP: 10.43.77.5, type: NodePort, ports: [{port: 80, nodePort: 30077}]}")
    assert rc == 0, err
    rc, _, err = create("fa-b", "{clusterIP: 10.43.77.5, ports: [{port: 80}]}")
    assert rc != 0
    assert ('The Service "fa-b" is invalid: spec.clusterIPs: Invalid value: ["10.43.77.5"]: failed to '
            "allocate IP 10.43.77.5: provided IP is already allocated") in err
    rc, _, err = create("fa-c", "{type: NodePort, ports: [{port: 80, nodePort: 30077}]}")
    assert rc != 0
    assert ('The Service "fa-c" is invalid: spec.ports[0].nodePort: Invalid value: 30077: provided port is '
            "already allocated") in err
    rc, _, err = create("fa-d", "{clusterIP: 10.99.0.5, ports: [{port: 80}]}")
    assert rc != 0
    assert ("the provided IP (10.99.0.5) is not in the valid range. The range of valid IPs is "
            "10.43.0.0/16") in err
    rc, _, err = create("fa-e", "{type: NodePort, ports: [{port: 80, nodePort: 40000}]}")
    assert rc != 0
    assert "provided port is not in the valid range. The range of valid ports is 30000-32767" in err
    # None of the refused ones exists or holds anything.
    rc, out, _ = kubectl("-n", namespace, "get", "svc", "-o", "name")
    assert out.split() == ["service/fa-a"]


@needs_kubectl
def test_type_change_releases_and_allocates(fleet_server: FleetServer, namespace: str, kubectl) -> None:
    rc, _, err = kubectl("-n", namespace, "create", "service", "nodeport", "fa-t", "--tcp=80", "--node-port=30099")
    assert rc == 0, err
    rc, _, err = kubectl("-n", namespace, "patch", "svc", "fa-t", "-p", '{"spec":{"type":"ClusterIP"}}')
    assert rc == 0, err
    # 30099 is free again: another Service takes it.
    rc, _, err = kubectl("-n", namespace, "create", "service", "nodeport", "fa-u", "--tcp=80", "--node-port=30099")
    assert rc == 0, err
    rc, ip, _ = kubectl("-n", namespace, "get", "svc", "fa-t", "-o", "jsonpath={.spec.clusterIP}")
    rc, _, err = kubectl("-n", namespace, "patch", "svc", "fa-t", "-p",
                         '{"spec":{"type":"ExternalName","externalName":"fa.example.com"}}')
    assert rc == 0, err
    rc, _, _ = kubectl("get", "ipaddress", ip)
    assert rc != 0  # released
    rc, _, err = kubectl("-n", namespace, "patch", "svc", "fa-t", "-p", '{"spec":{"type":"ClusterIP"}}')
    assert rc == 0, err
    rc, ip2, _ = kubectl("-n", namespace, "get", "svc", "fa-t", "-o", "jsonpath={.spec.clusterIP}")
    assert ip2.startswith(CIDR_PREFIX)
    rc, out, _ = kubectl("get", "ipaddress", ip2, "-o", "jsonpath={.spec.parentRef.name}")
    assert out == "fa-t"
    rc, _, err = kubectl("-n", namespace, "delete", "svc", "fa-t", "fa-u")
    assert rc == 0, err
    rc, _, _ = kubectl("get", "ipaddress", ip2)
    assert rc != 0


# ------------------------------------------------------------------ concurrency, crash


class Creator(threading.Thread):
    """Creates Services `prefix-<i>` for the indices it is given, recording the answers."""

    def __init__(self, srv: FleetServer, ns: str, names: list[str], *, node_port: bool = False) -> None:
        super().__init__(daemon=True)
        self.srv, self.ns, self.names, self.node_port = srv, ns, names, node_port
        self.created: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        with self.srv.client(timeout=30) as c:
            for name in self.names:
                body = svc_body(name, type="NodePort") if self.node_port else svc_body(name)
                try:
                    r = c.post(f"/api/v1/namespaces/{self.ns}/services", json=body)
                except httpx.HTTPError:
                    return  # the server died under us
                if r.status_code == 201:
                    self.created[name] = r.json()
                else:
                    self.errors.append(f"{r.status_code} {r.text[:300]}")


def test_500_concurrent_creates_get_distinct_cluster_ips(fleet_server: FleetServer, namespace: str) -> None:
    names = [f"fa-c{i:03d}" for i in range(500)]
    creators = [Creator(fleet_server, namespace, names[i::25]) for i in range(25)]
    t0 = time.monotonic()
    for c in creators:
        c.start()
    for c in creators:
        c.join(timeout=120)
    elapsed = time.monotonic() - t0
    assert not any(c.is_alive() for c in creators)
    assert not [e for c in creators for e in c.errors]
    created = {n: o for c in creators for n, o in c.created.items()}
    assert len(created) == 500
    ips = [o["spec"]["clusterIP"] for o in created.values()]
    assert len(set(ips)) == 500
    assert all(ip.startswith(CIDR_PREFIX) and ip != "10.43.0.1" for ip in ips)
    assert elapsed < 60, f"500 creates took {elapsed:.1f}s"
    # What is stored agrees: every Service has its own IPAddress.
    assert allocation_problems(fleet_server) == []


def test_kill_9_mid_creates_then_repair(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start(extra_args=["--service-repair-interval", "1"])
    ns = "fa-crash"
    create_namespace(srv, ns)
    names = [f"fa-k{i:04d}" for i in range(2000)]
    creators = [Creator(srv, ns, names[i::32], node_port=(i % 2 == 0)) for i in range(32)]
    for c in creators:
        c.start()
    wait_until(lambda: sum(len(c.created) for c in creators) >= 150, timeout=60, what="150 creates")
    srv.kill()
    for c in creators:
        c.join(timeout=30)
    acked = {n: o for c in creators for n, o in c.created.items()}
    srv.start()
    # Whether the kill caught a create between its reservation and its Service is
    # luck; make sure there is such a leak, as a crash leaves it.
    with srv.client() as c:
        r = c.post("/apis/networking.k8s.io/v1/ipaddresses", json={
            "apiVersion": "networking.k8s.io/v1", "kind": "IPAddress",
            "metadata": {"name": "10.43.250.250",
                         "labels": {"ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io"}},
            "spec": {"parentRef": {"group": "", "resource": "services", "namespace": ns, "name": "fa-ghost"}}})
        assert r.status_code == 201, r.text
    # The repair needs two passes to take a leak for one; wait for a clean picture.
    wait_until(lambda: not allocation_problems(srv), timeout=30, interval=0.5,
               what=f"allocations repaired: {allocation_problems(srv)[:5]}")
    assert "10.43.250.250" not in {a["metadata"]["name"] for a in ip_addresses(srv)}
    stored = {s["metadata"]["name"]: s for s in services(srv) if s["metadata"]["namespace"] == ns}
    for name, obj in acked.items():  # acknowledged creates survived with their address
        assert stored[name]["spec"]["clusterIP"] == obj["spec"]["clusterIP"]
    node_ports = Counter(p["nodePort"] for s in services(srv) for p in s["spec"]["ports"] if p.get("nodePort"))
    assert node_ports and all(n == 1 for n in node_ports.values())
    # NodePort reservations are internal store keys (no API): read them from the
    # store file (WAL mode lets a reader in beside the running server).
    wait_until(lambda: reserved_ports(srv) == set(node_ports), timeout=30, interval=0.5,
               what="port reservations to match the Services' NodePorts")


def reserved_ports(srv: FleetServer) -> set[int]:
    conn = sqlite3.connect(f"file:{srv.db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT key FROM live WHERE key LIKE '/fleet.internal/servicenodeports/%'").fetchall()
    finally:
        conn.close()
    return {int(k.rsplit("/", 1)[1]) for (k,) in rows}


def test_repair_recreates_a_deleted_ipaddress_with_an_event(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start(extra_args=["--service-repair-interval", "1"])
    with srv.client() as c:
        r = c.post("/api/v1/namespaces/default/services", json=svc_body("fa-r"))
        assert r.status_code == 201, r.text
        ip = r.json()["spec"]["clusterIP"]
        r = c.delete(f"/apis/networking.k8s.io/v1/ipaddresses/{ip}")
        assert r.status_code == 200, r.text

        def repaired() -> bool:
            r = c.get(f"/apis/networking.k8s.io/v1/ipaddresses/{ip}")
            return r.status_code == 200 and r.json()["spec"]["parentRef"]["name"] == "fa-r"

        wait_until(repaired, timeout=20, what="the IPAddress to be recreated")

        def event() -> list[dict[str, Any]]:
            items = c.get("/api/v1/namespaces/default/events").json()["items"]
            return [e for e in items if e["involvedObject"].get("name") == "fa-r"
                    and e["reason"] == "ClusterIPNotAllocated"]

        ev = wait_until(event, timeout=20, what="a ClusterIPNotAllocated event")
        assert ev[0]["type"] == "Warning"
        assert ev[0]["message"] == f"Cluster IP [IPv4]:{ip} is not allocated; repairing"

        # The `kubernetes` Service comes back when deleted (the bootstrap controller's job).
        r = c.delete("/api/v1/namespaces/default/services/kubernetes")
        assert r.status_code == 200, r.text

        def kubernetes_back() -> bool:
            r = c.get("/api/v1/namespaces/default/services/kubernetes")
            return r.status_code == 200 and r.json()["spec"]["clusterIP"] == "10.43.0.1"

        r = c.delete("/apis/networking.k8s.io/v1/servicecidrs/kubernetes")
        assert r.status_code == 200, r.text
        wait_until(kubernetes_back, timeout=20, what="the kubernetes Service to be recreated")
        wait_until(lambda: c.get("/apis/networking.k8s.io/v1/servicecidrs/kubernetes").status_code == 200,
                   timeout=20, what="the default ServiceCIDR to be recreated")
        r = c.get("/apis/networking.k8s.io/v1/ipaddresses/10.43.0.1")
        assert r.status_code == 200 and r.json()["spec"]["parentRef"]["name"] == "kubernetes"


# ----------------------------------------------------------------------- ServiceLB


def test_servicelb_ingress_follows_ready_nodes(fleet_server: FleetServer, namespace: str) -> None:
    def node(name: str, addrs: list[dict[str, str]]) -> dict[str, Any]:
        # Unschedulable: pods of the other tests of this module must not land on them.
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"unschedulable": True},
                "status": {"addresses": addrs, "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}

    with fleet_server.client() as c:
        try:
            r = c.post("/api/v1/nodes", json=node("fa-node-a", [{"type": "InternalIP", "address": "10.0.77.1"}]))
            assert r.status_code == 201, r.text
            r = c.post(f"/api/v1/namespaces/{namespace}/services", json=svc_body("fa-lb", type="LoadBalancer"))
            assert r.status_code == 201, r.text

            def ingress() -> list[str]:
                s = c.get(f"/api/v1/namespaces/{namespace}/services/fa-lb").json()
                return [i["ip"] for i in ((s.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []]

            wait_until(lambda: ingress() == ["10.0.77.1"], timeout=20, what="ingress of node a")
            r = c.post("/api/v1/nodes", json=node("fa-node-b", [{"type": "InternalIP", "address": "10.0.77.2"},
                                                                {"type": "ExternalIP", "address": "10.0.78.2"}]))
            assert r.status_code == 201, r.text
            wait_until(lambda: ingress() == ["10.0.77.1", "10.0.78.2"], timeout=20, what="ingress of both nodes")
            r = c.patch(f"/api/v1/namespaces/{namespace}/services/fa-lb", json={"spec": {"type": "ClusterIP"}},
                        headers={"content-type": "application/merge-patch+json"})
            assert r.status_code == 200, r.text
            wait_until(lambda: ingress() == [], timeout=20, what="ingress cleared")
            events = c.get(f"/api/v1/namespaces/{namespace}/events").json()["items"]
            assert any(e["reason"] == "UpdatedIngressIP" and e["type"] == "Normal" for e in events)
        finally:
            for n in ("fa-node-a", "fa-node-b"):
                c.delete(f"/api/v1/nodes/{n}")


@needs_kubectl
def test_small_service_cidr_exhausted(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start(extra_args=["--service-cidr", "10.96.0.0/29",
                                                 "--service-node-port-range", "31000-31009"])
    rc, out, err = srv.kubectl("get", "svc", "kubernetes", "-o", "jsonpath={.spec.clusterIP}")
    assert (rc, out) == (0, "10.96.0.1"), err
    for i in range(5):  # .2 to .6
        rc, _, err = srv.kubectl("create", "service", "nodeport", f"fa-{i}", "--tcp=80")
        assert rc == 0, err
    rc, _, err = srv.kubectl("create", "service", "clusterip", "fa-full", "--tcp=80")
    assert rc != 0
    assert "failed to allocate a serviceIP: range is full" in err and "10.96.0.0/29" in err, err
    rc, out, _ = srv.kubectl("get", "svc", "-o", "jsonpath={.items[*].spec.ports[*].nodePort}")
    assert all(31000 <= int(p) <= 31009 for p in out.split()) and len(out.split()) == 5
    rc, out, _ = srv.kubectl("get", "servicecidr", "kubernetes", "-o", "jsonpath={.spec.cidrs[0]}")
    assert out == "10.96.0.0/29"


def test_bad_service_flags_stop_start_up(fleet_server_factory: ServerFactory) -> None:
    for args in (["--service-cidr", "10.96.0.0/31"], ["--service-node-port-range", "32000-31000"]):
        srv = fleet_server_factory.new(extra_args=args)
        srv.spawn()
        code = srv.wait_exit(30)
        assert code not in (None, 0), args
        assert "fleet server:" in srv.output(), srv.output()[-2000:]
