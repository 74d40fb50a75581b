"""The Service dataplane against the real kernel, on a node built inside namespaces.

Topology (every piece created by the test, named `fd-*`, removed at the end even on
failure):

    "outside" netns                 "node" netns                        pod netns a, b, c
    ext0 192.0.2.2/24  ── veth ──   up0 192.0.2.1/24 (default via .2)   eth0 10.42.7.x/24
                                    fdbr0 bridge 10.42.7.1/24 ────────── veth per pod
                                    table ip fd_fleet      (bridge driver: masquerade out)
                                    table ip fd-proxy      (the service proxy)

Pods a and b run a tiny TCP server that answers "<pod name> <client address>" and
closes; hand-written Services and EndpointSlices are fed to `ServiceRules.sync` (the
function the agent's informer loop calls), and clients in pod c, in the node and in
the outside namespace connect to ClusterIPs and NodePorts.  Pod "b" is declared on
another node (`n2`) in the EndpointSlices, for the traffic-policy tests.
Needs root, `ip`, `nft`, `nsenter`, busybox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.network import NetworkConfig, PodRef, create_pod_netns, nft
from fleet.network.bridge import BridgeDriver
from fleet.network.proxy_diff import touched
from fleet.network.proxy_rules import ProxyOptions
from fleet.network.service_proxy import ServiceRules
from tests.e2e.netnode import node_and_outside

_missing = [t for t in ("ip", "nft", "nsenter", "busybox") if shutil.which(t) is None]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, nftables)"),
    pytest.mark.skipif(bool(_missing), reason=f"needs {', '.join(_missing)} installed"),
]

POD_CIDR = "10.42.7.0/24"
CLUSTER_CIDR = "10.42.0.0/16"
SERVICE_CIDR = "10.43.0.0/16"
NODE_IP = "192.0.2.1"
OUTSIDE_IP = "192.0.2.2"
GATEWAY = "10.42.7.1"
BRIDGE = "fdbr0"
TABLE = "fd-proxy"
CIP = "10.43.7.10"
NODE_PORT = 30080

SERVER = r"""
import socket, sys, threading
name = sys.argv[1]
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", 5353))
    while True:
        data, addr = u.recvfrom(100)
        u.sendto(f"{name} {addr[0]}".encode(), addr)
threading.Thread(target=udp, daemon=True).start()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(64)
print("ready", flush=True)
while True:
    c, addr = s.accept()
    c.sendall(f"{name} {addr[0]}\n".encode())
    c.close()
"""

CLIENT = r"""
import socket, sys, time
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    t0 = time.monotonic()
    try:
        c = socket.create_connection((ip, port), timeout=3)
        data = b""
        while not data.endswith(b"\n"):
            chunk = c.recv(100)
            if not chunk:
                break
            data += chunk
        c.close()
        print(data.decode().strip() or "EMPTY", flush=True)
    except OSError as e:
        print(f"ERR {type(e).__name__} {time.monotonic() - t0:.2f}", flush=True)
"""


UDP_CLIENT = r"""
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    u.sendto(b"q", (ip, port))
    try:
        print(u.recv(100).decode().split()[0], flush=True)
    except OSError as e:
        print(f"ERR {type(e).__name__}", flush=True)
    u.close()
"""


def sh(*argv: str) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


@dataclass
class Pod:
    name: str
    netns: str
    ip: str
    node: str


@dataclass
class Cluster:
    node_ns: str
    outside_ns: str
    pods: dict[str, Pod] = field(default_factory=dict)
    rules: ServiceRules | None = None

    def new_rules(self) -> ServiceRules:
        return ServiceRules(ProxyOptions(node_name="n1", node_ips=(NODE_IP,), cluster_cidr=CLUSTER_CIDR,
                                         service_cidr=SERVICE_CIDR, table=TABLE), netns=self.node_ns)

    async def connect(self, netns: str, ip: str, port: int, n: int = 1) -> list[str]:
        p = await trio.run_process(["nsenter", f"--net={netns}", sys.executable, "-c", CLIENT,
                                    ip, str(port), str(n)], capture_stdout=True, capture_stderr=True)
        return p.stdout.decode().split("\n")[:-1]

    async def who(self, netns: str, ip: str = CIP, port: int = 80, n: int = 1) -> list[str]:
        """The pod names that answered (or "ERR ..."), one per connection."""
        return [line.split()[0] if not line.startswith("ERR") else line
                for line in await self.connect(netns, ip, port, n)]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with node_cluster(tmp_path) as c:
        yield c


@asynccontextmanager
async def node_cluster(tmp_path: Path, prefix: str = "fd") -> AsyncIterator[Cluster]:
    """The node, the outside and pods a, b, c (netns and pod uids named `<prefix>-*`;
    other test modules reuse it with their own prefix)."""
    tag = uuid.uuid4().hex[:6]
    pod_dir = tmp_path / "netns"
    servers: list[subprocess.Popen[str]] = []
    # A real node has a default route; without one, an address nothing DNATs fails
    # routing before our filter chains see it.
    with node_and_outside(prefix, pod_dir, node_ip=NODE_IP, outside_ip=OUTSIDE_IP,
                          default_route=True) as (node_ns, outside_ns):
        try:
            c = Cluster(node_ns=node_ns, outside_ns=outside_ns)
            driver = BridgeDriver(NetworkConfig(pod_cidr=POD_CIDR, state_dir=str(tmp_path / "state"),
                                                cluster_cidr=CLUSTER_CIDR, host_netns=c.node_ns,
                                                options={"bridge": BRIDGE, "nft_table": "fd_fleet"}))
            for name, node in (("a", "n1"), ("b", "n2"), ("c", "n1")):
                ref = PodRef(uid=f"{prefix}-{name}-{tag}", namespace="default", name=name)
                ns = await create_pod_netns(ref.uid, pod_dir)
                net = await driver.setup(ref, ns)
                assert net.pod_ip
                c.pods[name] = Pod(name, ns, net.pod_ip, node)
                if name != "c":
                    p = subprocess.Popen(["nsenter", f"--net={ns}", sys.executable, "-c", SERVER, name],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    servers.append(p)
                    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            c.rules = c.new_rules()
            yield c
        finally:
            for p in servers:
                p.kill()
                p.wait()


def service(name: str = "web", ip: str = CIP, **spec: Any) -> dict[str, Any]:
    ports = [{"name": "http", "port": 80, "protocol": "TCP"}]
    if spec.get("type") == "NodePort":
        ports[0]["nodePort"] = NODE_PORT
    return {"metadata": {"namespace": "default", "name": name},
            "spec": {"clusterIP": ip, "ports": ports, **spec}}


def endpoint_slice(pods: list[Pod], name: str = "web", **ready: bool) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": f"{name}-1",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [p.ip], "nodeName": p.node,
                           "conditions": {"ready": ready.get(p.name, True)}} for p in pods]}


async def test_cluster_ip_balances_and_follows_endpoint_changes(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    a, b, c = cluster.pods["a"], cluster.pods["b"], cluster.pods["c"]
    first = await rules.sync([service()], [endpoint_slice([a, b])])
    assert first.kind == "full"
    assert await nft.table_exists("ip", TABLE, netns=cluster.node_ns)

    answers = Counter(await cluster.who(c.netns, n=40))
    assert set(answers) == {"a", "b"}, answers  # random balancing reaches both

    # From the node itself (output hook) too.
    assert set(await cluster.who(cluster.node_ns, n=20)) == {"a", "b"}

    # b stops being ready: only a answers; the transaction touches only web's objects.
    res = await rules.sync([service()], [endpoint_slice([a, b], b=False)])
    assert res.kind == "incremental"
    assert touched(res.ops) and all("/web/" in name for name in touched(res.ops)), res.script
    assert "delete table" not in res.script and "flush chain ip fd-proxy services" not in res.script
    assert set(await cluster.who(c.netns, n=20)) == {"a"}

    # Nothing changed: no transaction at all.
    again = await rules.sync([service()], [endpoint_slice([a, b], b=False)])
    assert again.kind == "noop" and again.script == ""


async def test_no_endpoints_is_refused_at_once_and_wrong_ports_too(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    c = cluster.pods["c"]
    await rules.sync([service(), service("np", ip="10.43.7.11", type="NodePort")],
                     [endpoint_slice([cluster.pods["a"]], a=False)])
    for netns, ip, port in ((c.netns, CIP, 80), (cluster.outside_ns, NODE_IP, NODE_PORT),
                            (c.netns, CIP, 81)):
        (line,) = await cluster.connect(netns, ip, port)
        kind, seconds = line.split()[1:]
        assert kind == "ConnectionRefusedError" and float(seconds) < 1.0, (ip, port, line)
    # An address of the service range nobody holds is dropped (a timeout, not a refusal).
    (line,) = await cluster.connect(c.netns, "10.43.7.99", 80)
    assert line.split()[1] in ("TimeoutError", "timeout"), line


async def test_nodeport_from_outside_with_both_traffic_policies(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    a, b = cluster.pods["a"], cluster.pods["b"]
    await rules.sync([service(type="NodePort")], [endpoint_slice([a, b])])
    lines = await cluster.connect(cluster.outside_ns, NODE_IP, NODE_PORT, 30)
    assert {ln.split()[0] for ln in lines} == {"a", "b"}, lines
    # Cluster policy masquerades: the pods see the node, never the client.
    assert {ln.split()[1] for ln in lines} == {GATEWAY}

    # Local: only the endpoint on this node (a), and the client's own address kept.
    await rules.sync([service(type="NodePort", externalTrafficPolicy="Local")],
                     [endpoint_slice([a, b])])
    lines = await cluster.connect(cluster.outside_ns, NODE_IP, NODE_PORT, 20)
    assert {tuple(ln.split()) for ln in lines} == {("a", OUTSIDE_IP)}, lines
    # The ClusterIP still reaches both.
    assert set(await cluster.who(cluster.pods["c"].netns, n=30)) == {"a", "b"}

    # Local with no endpoint on this node: dropped, not sent elsewhere.
    await rules.sync([service(type="NodePort", externalTrafficPolicy="Local")], [endpoint_slice([b])])
    (line,) = await cluster.connect(cluster.outside_ns, NODE_IP, NODE_PORT)
    assert line.startswith("ERR") and "Refused" not in line, line


async def test_hairpin_pod_reaches_itself_through_its_service(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    a = cluster.pods["a"]
    await rules.sync([service()], [endpoint_slice([a])])
    lines = await cluster.connect(a.netns, CIP, 80, 3)
    # Masqueraded to the gateway, so the reply comes back through the node's conntrack.
    assert [tuple(ln.split()) for ln in lines] == [("a", GATEWAY)] * 3, lines


async def test_session_affinity_keeps_a_client_on_one_endpoint(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    a, b, c = cluster.pods["a"], cluster.pods["b"], cluster.pods["c"]
    await rules.sync([service(sessionAffinity="ClientIP")], [endpoint_slice([a, b])])
    answers = await cluster.who(c.netns, n=20)
    assert len(set(answers)) == 1 and answers[0] in ("a", "b"), answers
    listing = await nft.list_table("ip", TABLE, netns=cluster.node_ns)
    assert c.ip in listing  # the client sits in one endpoint's affinity set
    # The node (another client) is pinned too, independently.
    assert len(set(await cluster.who(cluster.node_ns, n=10))) == 1


async def test_restart_keeps_rules_and_reconciles(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    a, b, c = cluster.pods["a"], cluster.pods["b"], cluster.pods["c"]
    await rules.sync([service()], [endpoint_slice([a, b])])
    # "Agent stopped": nothing is torn down, the Service keeps working meanwhile.
    del rules
    assert set(await cluster.who(c.netns, n=20)) == {"a", "b"}
    # "Agent started" with a world that changed while it was down: one atomic replace.
    fresh = cluster.new_rules()
    t0 = time.monotonic()
    res = await fresh.sync([service()], [endpoint_slice([b])])
    assert res.kind == "full" and time.monotonic() - t0 < 10
    assert set(await cluster.who(c.netns, n=10)) == {"b"}
    # The table vanishing (someone flushed the ruleset) is noticed and rebuilt whole.
    await nft.delete_table("ip", TABLE, netns=cluster.node_ns)
    assert not await fresh.check_present()
    assert (await fresh.sync([service()], [endpoint_slice([b])])).kind == "full"
    assert set(await cluster.who(c.netns, n=5)) == {"b"}
    assert await fresh.uninstall()
    assert not await nft.table_exists("ip", TABLE, netns=cluster.node_ns)


async def test_agent_loop_follows_the_api(cluster: Cluster, fleet_server: Any) -> None:
    """`run_service_proxy` — the agent's task — on a real server's Services and
    EndpointSlices: first sync once the informers listed, then every change."""
    from fleet.client import Client, load_kubeconfig
    from fleet.network.service_proxy import ServiceProxyConfig, run_service_proxy

    a, b, c = cluster.pods["a"], cluster.pods["b"], cluster.pods["c"]
    ns = f"fd-{uuid.uuid4().hex[:6]}"
    cip = "10.43.7.20"
    async with Client(load_kubeconfig(str(fleet_server.kubeconfig))) as client:
        await client.create("v1", "namespaces", {"metadata": {"name": ns}})
        svc = service("loop", ip=cip)
        svc["metadata"]["namespace"] = ns
        await client.create("v1", "services", svc, namespace=ns)
        es = endpoint_slice([a, b], name="loop")
        es["metadata"]["namespace"] = ns
        es = await client.create("discovery.k8s.io/v1", "endpointslices", es, namespace=ns)
        cfg = ServiceProxyConfig(node_name="n1", cluster_cidr=CLUSTER_CIDR, service_cidr=SERVICE_CIDR,
                                 table=TABLE, netns=cluster.node_ns, min_sync_interval=0.05)
        async with trio.open_nursery() as n:
            with trio.fail_after(20):
                rules = await n.start(run_service_proxy, client, cfg)
            assert set(await cluster.who(c.netns, cip, n=30)) == {"a", "b"}

            es["endpoints"] = es["endpoints"][1:]  # a goes away
            await client.replace("discovery.k8s.io/v1", "endpointslices", "loop-1", es, namespace=ns)
            with trio.fail_after(10):
                while set(await cluster.who(c.netns, cip, n=10)) != {"b"}:
                    await trio.sleep(0.1)

            await client.delete("v1", "services", "loop", namespace=ns)
            # (The server's own Services — kubernetes, kube-dns — keep their elements.)
            with trio.fail_after(10):
                while rules.applied is None or any(
                        cip in str(e) for e in rules.applied.elements["service-ips"]):
                    await trio.sleep(0.05)
            n.cancel_scope.cancel()
        await client.delete("v1", "namespaces", ns)
    # Stopping the proxy leaves the table in place (a restarted agent reconciles it).
    assert await nft.table_exists("ip", TABLE, netns=cluster.node_ns)


async def test_udp_service(cluster: Cluster) -> None:
    """A UDP port (DNS-like, named "dns", endpoint port 5353) through its ClusterIP."""
    rules = cluster.rules
    assert rules is not None
    a, b, c = cluster.pods["a"], cluster.pods["b"], cluster.pods["c"]
    svc = {"metadata": {"namespace": "kube-system", "name": "dns"},
           "spec": {"clusterIP": "10.43.7.53", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}
    es = {"metadata": {"namespace": "kube-system", "name": "dns-1",
                       "labels": {"kubernetes.io/service-name": "dns"}},
          "addressType": "IPv4", "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
          "endpoints": [{"addresses": [p.ip]} for p in (a, b)]}
    await rules.sync([svc], [es])
    p = await trio.run_process(["nsenter", f"--net={c.netns}", sys.executable, "-c", UDP_CLIENT,
                                "10.43.7.53", "53", "30"], capture_stdout=True)
    assert set(p.stdout.decode().split()) == {"a", "b"}, p.stdout



async def test_load_balancer_on_the_node_address_and_external_ips(cluster: Cluster) -> None:
    """ServiceLB style: `status.loadBalancer.ingress` is the node's own address, so
    node:port (the service port, not a NodePort) reaches the Service; an externalIP
    routed to the node does too."""
    rules = cluster.rules
    assert rules is not None
    a, b = cluster.pods["a"], cluster.pods["b"]
    sh("ip", "netns", "exec", Path(cluster.outside_ns).name, "ip", "route", "add",
       "198.51.100.7/32", "via", NODE_IP)
    lb = service(type="LoadBalancer", externalIPs=["198.51.100.7"])
    lb["spec"]["ports"][0]["nodePort"] = NODE_PORT
    lb["status"] = {"loadBalancer": {"ingress": [{"ip": NODE_IP}]}}
    await rules.sync([lb], [endpoint_slice([a, b])])
    for ip, port in ((NODE_IP, 80), ("198.51.100.7", 80), (NODE_IP, NODE_PORT)):
        lines = await cluster.connect(cluster.outside_ns, ip, port, 20)
        assert {ln.split()[0] for ln in lines} == {"a", "b"}, (ip, port, lines)
