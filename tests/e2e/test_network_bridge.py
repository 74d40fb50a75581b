"""The bridge network driver against the real kernel, on a node built inside namespaces.

Topology (every piece created by the test and removed at the end, even on failure):

    "outside" netns                 "node" netns                      pod netns A, B
    ext0 192.0.2.2/24  ── veth ──   up0 192.0.2.1/24                  eth0 10.244.7.x/24
                                    fltest0 bridge 10.244.7.1/24 ──── veth per pod
                                    table ip fleet (masquerade)

The driver runs with `host_netns` = the node namespace, so the machine's own network
stack is never touched; addresses are TEST-NET-1 and a private pod CIDR that exist
only inside these namespaces.  Needs root, `ip`, `nft`, `nsenter` and busybox.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from fleet.network import (
    NetworkConfig,
    NetworkError,
    PodRef,
    create_pod_netns,
    delete_pod_netns,
    nft,
)
from fleet.network.bridge import BridgeDriver, host_veth_name
from fleet.network.ipam import IPAMExhausted
from fleet.network.netns import is_netns
from tests.e2e.netnode import node_and_outside

_missing = [t for t in ("ip", "nft", "nsenter", "busybox") if shutil.which(t) is None]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, veths)"),
    pytest.mark.skipif(bool(_missing), reason=f"needs {', '.join(_missing)} installed"),
]

POD_CIDR = "10.244.7.0/24"
GATEWAY = "10.244.7.1"
NODE_OUTSIDE_IP = "192.0.2.1"
OUTSIDE_IP = "192.0.2.2"
BRIDGE = "fltest0"


def sh(*argv: str, netns: str | None = None, check: bool = True) -> str:
    """Run a command (in the namespace at path `netns`); returns stdout."""
    full = (["nsenter", f"--net={netns}"] if netns else []) + list(argv)
    p = subprocess.run(full, capture_output=True, text=True, timeout=20)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(full)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def links(netns: str) -> dict[str, dict]:
    return {link["ifname"]: link for link in json.loads(sh("ip", "-j", "-d", "link", "show", netns=netns))}


def ipv4_addrs(netns: str, dev: str) -> list[str]:
    out = json.loads(sh("ip", "-j", "-4", "addr", "show", "dev", dev, netns=netns))
    return [f"{a['local']}/{a['prefixlen']}" for entry in out for a in entry["addr_info"]]


@dataclass
class Node:
    """The test's node: namespace paths and the driver's configuration."""

    node_ns: str
    outside_ns: str
    pod_dir: Path
    state_dir: Path

    def config(self, pod_cidr: str = POD_CIDR, **options: object) -> NetworkConfig:
        return NetworkConfig(
            pod_cidr=pod_cidr,
            state_dir=str(self.state_dir),
            host_netns=self.node_ns,
            options={"bridge": BRIDGE, **options},
        )

    def driver(self, pod_cidr: str = POD_CIDR) -> BridgeDriver:
        return BridgeDriver(self.config(pod_cidr))

    async def pod(self, name: str) -> tuple[PodRef, str]:
        ref = PodRef(uid=f"uid-{name}-{uuid.uuid4().hex[:8]}", namespace="default", name=name)
        return ref, await create_pod_netns(ref.uid, self.pod_dir)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    pod_dir = tmp_path / "netns"
    with node_and_outside("flt", pod_dir, node_ip=NODE_OUTSIDE_IP,
                          outside_ip=OUTSIDE_IP) as (node_ns, outside_ns):
        yield Node(node_ns=node_ns, outside_ns=outside_ns, pod_dir=pod_dir,
                   state_dir=tmp_path / "state")


async def run_in(netns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        ["nsenter", f"--net={netns}", *argv], capture_stdout=True, capture_stderr=True, check=check
    )


async def ping(netns: str, ip: str) -> bool:
    p = await run_in(netns, "busybox", "ping", "-c", "1", "-W", "2", ip, check=False)
    return p.returncode == 0


SERVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((%r, 0))
s.listen(1)
s.settimeout(15)
print(s.getsockname()[1], flush=True)
c, addr = s.accept()
print(addr[0], c.recv(16).decode(), flush=True)
"""

CLIENT = """
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).sendall(b"hello")
"""


async def test_two_pods_talk_to_each_other_and_out_through_masquerade(node: Node) -> None:
    host_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    driver = node.driver()
    a, a_ns = await node.pod("a")
    b, b_ns = await node.pod("b")
    net_a = await driver.setup(a, a_ns)
    net_b = await driver.setup(b, b_ns)
    cidr = ipaddress.IPv4Network(POD_CIDR)
    assert net_a.pod_ip != net_b.pod_ip
    for net, ns in ((net_a, a_ns), (net_b, b_ns)):
        ip = ipaddress.IPv4Address(net.pod_ip)
        assert ip in cidr and str(ip) not in (GATEWAY, "10.244.7.0", "10.244.7.255")
        assert net.gateway == GATEWAY and net.prefix_length == 24 and net.interface == "eth0"
        pod_links = links(ns)
        assert set(pod_links) == {"lo", "eth0"}
        assert pod_links["eth0"]["address"] == net.mac
        assert "UP" in pod_links["eth0"]["flags"] and "UP" in pod_links["lo"]["flags"]
        assert ipv4_addrs(ns, "eth0") == [f"{net.pod_ip}/24"]
        routes = json.loads(sh("ip", "-j", "route", "show", "default", netns=ns))
        assert [(r["gateway"], r["dev"]) for r in routes] == [(GATEWAY, "eth0")]

    # The node side: bridge with the gateway, both veths on it, forwarding, our table.
    node_links = links(node.node_ns)
    assert ipv4_addrs(node.node_ns, BRIDGE) == [f"{GATEWAY}/24"]
    for ref, net in ((a, net_a), (b, net_b)):
        veth = node_links[host_veth_name(ref.uid)]
        assert net.host_interface == veth["ifname"]
        assert veth["master"] == BRIDGE and "UP" in veth["flags"]
    assert sh("cat", "/proc/sys/net/ipv4/ip_forward", netns=node.node_ns).strip() == "1"
    assert "masquerade" in await nft.list_table("ip", "fleet", netns=node.node_ns)
    # ... and none of it leaked into the machine's own namespace.
    assert BRIDGE not in links(f"/proc/{os.getpid()}/ns/net")
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == host_forward

    assert await ping(a_ns, net_b.pod_ip), "pod A cannot ping pod B"
    assert await ping(b_ns, net_a.pod_ip), "pod B cannot ping pod A"
    assert await ping(a_ns, GATEWAY)

    # Pod A -> a listener outside the node: it must see the node's address (masquerade),
    # since the outside namespace has no route back to the pod CIDR at all.
    server = subprocess.Popen(
        ["nsenter", f"--net={node.outside_ns}", sys.executable, "-c", SERVER % OUTSIDE_IP],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        port = int(await trio.to_thread.run_sync(server.stdout.readline))
        await run_in(a_ns, sys.executable, "-c", CLIENT, OUTSIDE_IP, str(port))
        with trio.fail_after(10):
            seen = (await trio.to_thread.run_sync(server.stdout.readline)).split()
        assert seen == [NODE_OUTSIDE_IP, "hello"], (seen, server.stderr.read())
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


async def test_setup_is_idempotent(node: Node) -> None:
    driver = node.driver()
    a, a_ns = await node.pod("a")
    first = await driver.setup(a, a_ns)
    again = await driver.setup(a, a_ns)
    assert again == first
    assert ipv4_addrs(a_ns, "eth0") == [f"{first.pod_ip}/24"]
    veths = [n for n, link in links(node.node_ns).items() if link.get("master") == BRIDGE]
    assert veths == [host_veth_name(a.uid)]
    allocations = (await driver.ipam()).allocations()
    assert {u: str(ip) for u, ip in allocations.items()} == {a.uid: first.pod_ip}


async def test_teardown_removes_the_veth_and_releases_the_address(node: Node) -> None:
    driver = node.driver()
    a, a_ns = await node.pod("a")
    b, b_ns = await node.pod("b")
    net_a = await driver.setup(a, a_ns)
    await driver.setup(b, b_ns)

    await driver.teardown(a, a_ns)
    assert host_veth_name(a.uid) not in links(node.node_ns)
    assert set(links(a_ns)) == {"lo"}
    ipam = await driver.ipam()
    assert ipam.lookup(a.uid) is None and ipam.lookup(b.uid) is not None
    assert not await ping(b_ns, net_a.pod_ip)

    # Idempotent, including once the namespace itself is gone.
    await driver.teardown(a, a_ns)
    await delete_pod_netns(a_ns)
    assert not is_netns(a_ns)
    await driver.teardown(a, a_ns)
    # Deleting a pod's namespace (the runtime's job) takes its veth pair with it —
    # once the kernel's asynchronous namespace cleanup has run.
    await delete_pod_netns(b_ns)
    with trio.fail_after(10):
        while host_veth_name(b.uid) in links(node.node_ns):
            await trio.sleep(0.05)
    await driver.teardown(b, b_ns)
    assert ipam.allocations() == {}


async def test_recover_after_restart_keeps_live_pods_and_releases_the_rest(node: Node) -> None:
    driver = node.driver()
    a, a_ns = await node.pod("a")
    b, b_ns = await node.pod("b")
    net_a = await driver.setup(a, a_ns)
    net_b = await driver.setup(b, b_ns)

    # The agent restarts: a fresh driver over the same state dir; pod B died meanwhile
    # but its namespace (and so its veth) is still around.
    restarted = node.driver()
    await restarted.recover([a])
    ipam = await restarted.ipam()
    assert {u: str(ip) for u, ip in ipam.allocations().items()} == {a.uid: net_a.pod_ip}
    node_links = links(node.node_ns)
    assert host_veth_name(a.uid) in node_links
    assert host_veth_name(b.uid) not in node_links
    assert await ping(a_ns, GATEWAY), "recover disturbed a live pod"

    assert await restarted.setup(a, a_ns) == net_a
    c, c_ns = await node.pod("c")
    net_c = await restarted.setup(c, c_ns)
    assert net_c.pod_ip not in (net_a.pod_ip, None)
    # Next-fit: B's just-released address is not reused straight away.
    assert net_c.pod_ip != net_b.pod_ip


async def test_exhausted_pod_cidr_is_a_clear_error_and_leaves_nothing_behind(node: Node) -> None:
    # A /30 holds the gateway (.1) and exactly one pod (.2).
    driver = node.driver("10.244.9.0/30")
    a, a_ns = await node.pod("a")
    b, b_ns = await node.pod("b")
    assert (await driver.setup(a, a_ns)).pod_ip == "10.244.9.2"
    with pytest.raises(IPAMExhausted, match="10.244.9.0/30"):
        await driver.setup(b, b_ns)
    assert host_veth_name(b.uid) not in links(node.node_ns)
    assert set(links(b_ns)) == {"lo"}
    # Freeing the one address makes room again.
    await driver.teardown(a, a_ns)
    assert (await driver.setup(b, b_ns)).pod_ip == "10.244.9.2"


async def test_a_failed_setup_releases_its_address(node: Node) -> None:
    driver = node.driver()
    bad = PodRef(uid="uid-no-netns", namespace="default", name="bad")
    with pytest.raises(NetworkError, match="is not a network namespace"):
        await driver.setup(bad, str(node.pod_dir / "uid-no-netns"))
    assert (await driver.ipam()).allocations() == {}
    assert host_veth_name(bad.uid) not in links(node.node_ns)


async def test_host_network_pods_are_left_alone(node: Node) -> None:
    driver = node.driver()
    pod = PodRef.from_pod(
        {"metadata": {"uid": "uid-hostnet", "name": "h", "namespace": "kube-system"},
         "spec": {"hostNetwork": True}}
    )
    net = await driver.setup(pod, "")
    assert net.host_network and net.ips == () and net.pod_ip is None
    assert (await driver.ipam()).allocations() == {}
    assert BRIDGE not in links(node.node_ns)
    await driver.teardown(pod, "")


async def test_missing_bridge_is_rebuilt_and_uninstall_removes_node_setup(node: Node) -> None:
    driver = node.driver()
    a, a_ns = await node.pod("a")
    await driver.setup(a, a_ns)
    sh("ip", "link", "del", BRIDGE, netns=node.node_ns)  # someone removed it
    b, b_ns = await node.pod("b")
    net_b = await driver.setup(b, b_ns)
    assert ipv4_addrs(node.node_ns, BRIDGE) == [f"{GATEWAY}/24"]
    assert await ping(b_ns, GATEWAY)
    # Pod A's veth lost its bridge; setting A up again re-attaches it.
    await driver.setup(a, a_ns)
    assert await ping(a_ns, net_b.pod_ip)

    await driver.uninstall()
    assert BRIDGE not in links(node.node_ns)
    assert not await nft.table_exists("ip", "fleet", netns=node.node_ns)
    await driver.uninstall()  # idempotent
