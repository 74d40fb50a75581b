"""Pods' DNS end to end: resolv.conf, /etc/hosts and hostname in real pods, and names
resolved from inside a pod through 10.43.0.10 by the server's cluster DNS.

`fleet server` with its built-in agent (runc, bridge `fs-dnsbr0`, a test-only cluster
CIDR, the agent's Service rules); the node's resolv.conf is a file the test writes
(`--resolv-conf`), the DNS upstream a dnslib resolver on loopback
(tests/e2e/test_cluster_dns.py), kube-dns' endpoint the bridge's gateway.  Traffic goes
only between the pods' namespaces, the test's bridge and loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, push
from tests.conftest import FleetServer, create_namespace, free_port
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import delete_pods_and_wait_clean, finish
from tests.e2e.test_cluster_dns import Upstream
from tests.e2e.test_image_registry import REGISTRY_BIN, Registry

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runc, bridge networking)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(REGISTRY_BIN is None, reason="needs docker-registry"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
]

BRIDGE = "fs-dnsbr0"
CLUSTER_CIDR = "10.247.0.0/16"
GATEWAY = "10.247.0.1"


@pytest.fixture
def cluster(fleet_server_factory: Any, tmp_path: Path) -> Iterator[tuple[FleetServer, str, str, int]]:
    reg = Registry(tmp_path / "registry", free_port())
    (tmp_path / "registry").mkdir()
    up = Upstream()
    reg.start()
    srv: FleetServer | None = None
    ns = f"fs-dns-{uuid.uuid4().hex[:6]}"
    try:
        trio.run(push, build_busybox_image(), reg.url, "e2e/busybox", "v1")
        resolv = tmp_path / "node-resolv.conf"
        resolv.write_text("nameserver 192.0.2.53\nsearch fs-corp.example\noptions timeout:1\n")
        dns_port = free_port()
        srv = fleet_server_factory.start(extra_args=[
            "--agent-port", str(free_port()), "--agent-network", "bridge", "--agent-bridge", BRIDGE,
            "--cluster-cidr", CLUSTER_CIDR, "--resolv-conf", str(resolv),
            "--cluster-dns-bind", f"0.0.0.0:{dns_port}", "--dns-upstream", f"127.0.0.1:{up.port}",
            # kube-dns' endpoint: the gateway of the test's bridge (the node's first /24).
            "--cluster-dns-advertise", GATEWAY])
        create_namespace(srv, ns)
        yield srv, ns, f"{reg.host}/e2e/busybox:v1", dns_port
    finally:
        if srv is not None:
            agent_dir = srv.data_dir / "agent"
            leaked = delete_pods_and_wait_clean(srv, agent_dir, ns)
            srv.stop()
            finish(agent_dir, leaked, srv.output())
        up.close()
        reg.stop()


def _post(srv: FleetServer, path: str, obj: dict[str, Any]) -> None:
    with srv.client() as c:
        r = c.post(path, json=obj)
    assert r.status_code == 201, r.text


def _running(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with srv.client() as c:
            p = c.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
        return p if p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP") else None
    return wait_until(check, timeout=90, what=f"pod {name} Running")


def _exec(srv: FleetServer, ns: str, pod: str, script: str) -> str:
    rc, out, err = srv.kubectl("-n", ns, "exec", pod, "--", "sh", "-c", script, timeout=60)
    assert rc == 0, f"{script}: {rc} {out} {err}"
    return out


def test_pod_resolv_conf_hosts_and_cluster_names(cluster: tuple[FleetServer, str, str, int]) -> None:
    srv, ns, image, dns_port = cluster
    sleeper = {"name": "c", "image": image, "command": ["sh", "-c", "sleep 3600"]}
    _post(srv, f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"clusterIP": "10.43.91.9", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80}]}})
    _post(srv, f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"name": "pg", "port": 5432}]}})
    for name, spec in (
        ("cf", {}),
        ("member", {"hostname": "db-0", "subdomain": "db"}),
        ("dflt", {"dnsPolicy": "Default"}),
        ("hostnet", {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}),
        ("hostnet-default", {"hostNetwork": True}),
        ("custom", {"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["192.0.2.77"], "searches": ["fs-a.example"],
            "options": [{"name": "ndots", "value": "2"}]}}),
    ):
        _post(srv, f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [sleeper], **spec}})
    cf = _running(srv, ns, "cf")
    assert cf["status"]["podIP"].startswith(GATEWAY.rsplit(".", 1)[0] + "."), cf["status"]
    assert _exec(srv, ns, "cf", "cat /etc/resolv.conf") == (
        "nameserver 10.43.0.10\n"
        f"search {ns}.svc.cluster.local svc.cluster.local cluster.local fs-corp.example\n"
        "options ndots:5\n")
    assert _exec(srv, ns, "dflt", "cat /etc/resolv.conf") == (
        "nameserver 192.0.2.53\nsearch fs-corp.example\noptions timeout:1\n")
    _running(srv, ns, "hostnet")
    assert _exec(srv, ns, "hostnet", "cat /etc/resolv.conf") == (
        "nameserver 10.43.0.10\n"
        f"search {ns}.svc.cluster.local svc.cluster.local cluster.local fs-corp.example\n"
        "options ndots:5\n")
    _running(srv, ns, "hostnet-default")  # ClusterFirst with the host's network: Default
    assert _exec(srv, ns, "hostnet-default", "cat /etc/resolv.conf") == (
        "nameserver 192.0.2.53\nsearch fs-corp.example\noptions timeout:1\n")
    assert _exec(srv, ns, "custom", "cat /etc/resolv.conf") == (
        "nameserver 192.0.2.77\nsearch fs-a.example\noptions ndots:2\n")
    member = _running(srv, ns, "member")
    assert _exec(srv, ns, "member", "hostname").strip() == "db-0"
    hosts = _exec(srv, ns, "member", "cat /etc/hosts")
    assert f"{member['status']['podIP']}\tdb-0.db.{ns}.svc.cluster.local\tdb-0\n" in hosts

    # The headless member's name, as the endpoints controller would publish it.
    _post(srv, f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "db-fs", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
        "endpoints": [{"addresses": [member["status"]["podIP"]], "hostname": "db-0",
                       "conditions": {"ready": True}}]})
    # From inside the pod, the way pods ask: /etc/resolv.conf's 10.43.0.10:53, which the
    # node's Service rules DNAT to kube-dns' endpoint (the listener, at the bridge's
    # gateway): a Service, the StatefulSet member, an outside name answered by the
    # loopback upstream, and a short name through the search path (busybox nslookup
    # does not search; ping's resolver does, and prints the address it resolved).
    for name, want in ((f"web.{ns}.svc.cluster.local", "10.43.91.9"),
                       (f"db-0.db.{ns}.svc.cluster.local", member["status"]["podIP"]),
                       ("api.fs-up.test", "192.0.2.1")):
        out = wait_until(lambda n=name, w=want: (lambda o: o if w in o else None)(
            _exec(srv, ns, "cf", f"nslookup {n} 2>&1 || true")), timeout=30,
            what=f"nslookup {name} in the pod")
        assert "10.43.0.10" in out and want in out, json.dumps(out)
    out = _exec(srv, ns, "cf", "ping -c1 -W1 web 2>&1 || true")
    assert "PING web (10.43.91.9)" in out, out
    # The listener itself, at the gateway, answers the pod too.
    out = _exec(srv, ns, "cf", f"nslookup web.{ns}.svc.cluster.local {GATEWAY}:{dns_port} 2>&1 || true")
    assert "10.43.91.9" in out, out
