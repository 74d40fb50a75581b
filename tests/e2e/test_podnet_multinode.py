"""The pod network across nodes, with real agents on machines in network namespaces
(tests/e2e/multinode.py): pods on different nodes reach each other by pod IP and see
each other's real addresses (no masquerade), over host-gw routes, over VXLAN forced by
flag, and over VXLAN chosen automatically for a node on another L2 segment; egress to
outside the cluster is masqueraded; a node that leaves takes its routes with it.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.conftest import _server_env
from tests.e2e.multinode import MultiNodeCluster, Node

pytestmark = [pytest.mark.e2e]

# busybox httpd with a CGI that answers the client's address as the server saw it.
# /www/big: 300 KiB, more than fits a 1450-byte VXLAN MTU in one packet by far.
SERVE = ("mkdir -p /www/cgi-bin; dd if=/dev/zero of=/www/big bs=1024 count=300 2>/dev/null; "
         "printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho $REMOTE_ADDR\\n' "
         "> /www/cgi-bin/ip; chmod +x /www/cgi-bin/ip; exec httpd -f -p 8080 -h /www")
PROTO = "70"  # fleet.network.peers.ROUTE_PROTOCOL


def start_web(cluster: MultiNodeCluster, ns: str, name: str, node: Node) -> dict[str, Any]:
    manifest = cluster.pod(name, node, ["sh", "-c", SERVE])
    manifest["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/cgi-bin/ip", "port": 8080}, "periodSeconds": 1}
    cluster.create_pod(ns, manifest)
    return manifest


def wget_from(cluster: MultiNodeCluster, ns: str, pod: str, url: str) -> str:
    """What `wget url` inside `pod` prints (retried briefly while routes converge)."""
    deadline = time.monotonic() + 20
    while True:
        # (busybox 1.35's `wget -T` segfaults: `timeout` bounds it instead.)
        rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "timeout", "5", "wget", "-q",
                                       "-O", "-", url)
        if rc == 0 or time.monotonic() > deadline:
            assert rc == 0, f"wget {url} from {pod}: {rc} {out} {err}"
            # httpd listens dual-stack: an IPv4 client shows as [::ffff:a.b.c.d].
            return out.strip().removeprefix("[::ffff:").removesuffix("]")
        time.sleep(0.5)


def fetch_size(cluster: MultiNodeCluster, ns: str, pod: str, url: str) -> int:
    """Bytes `wget url` inside `pod` received (full-size packets must get through)."""
    rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c",
                                   f"timeout 20 wget -q -O - {url} | wc -c")
    assert rc == 0, (rc, out, err)
    return int(out.strip())


def routes(cluster: MultiNodeCluster, node: Node) -> dict[str, dict[str, Any]]:
    """The node's routes with our protocol, by destination."""
    p = cluster.exec_in(node.ns, ["ip", "-j", "route", "show", "proto", PROTO], check=True)
    return {r["dst"]: r for r in json.loads(p.stdout or "[]")}


def wait_routes(cluster: MultiNodeCluster, node: Node, want: set[str],
                timeout: float = 20.0) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        got = routes(cluster, node)
        if set(got) == want or time.monotonic() > deadline:
            assert set(got) == want, (node.name, got, want)
            return got
        time.sleep(0.2)


def pod_cidr(cluster: MultiNodeCluster, node: Node) -> str:
    obj = cluster.node_object(node)
    assert obj is not None
    return obj["spec"]["podCIDR"]


def check_pod_to_pod(cluster: MultiNodeCluster, ns: str, a: tuple[str, Node],
                     b: tuple[str, Node]) -> None:
    """Pods a and b (on different nodes) reach each other and see each other's pod IP."""
    ip_a = cluster.wait_pod_ready(ns, a[0])["status"]["podIP"]
    ip_b = cluster.wait_pod_ready(ns, b[0])["status"]["podIP"]
    assert ip_a != ip_b
    assert wget_from(cluster, ns, a[0], f"http://{ip_b}:8080/cgi-bin/ip") == ip_a
    assert wget_from(cluster, ns, b[0], f"http://{ip_a}:8080/cgi-bin/ip") == ip_b
    assert fetch_size(cluster, ns, a[0], f"http://{ip_b}:8080/big") == 300 * 1024


def test_pods_on_two_nodes_talk_over_host_gw_without_masquerade(multinode: MultiNodeCluster) -> None:
    cluster = multinode
    n0, n1 = cluster.nodes
    ns = cluster.create_namespace()
    start_web(cluster, ns, "a", n0)
    start_web(cluster, ns, "b", n1)

    # host-gw: each node routes the other's pod CIDR via its InternalIP on eth0.
    r0 = wait_routes(cluster, n0, {pod_cidr(cluster, n1)})[pod_cidr(cluster, n1)]
    assert (r0["gateway"], r0["dev"]) == (n1.address, "eth0"), r0
    r1 = wait_routes(cluster, n1, {pod_cidr(cluster, n0)})[pod_cidr(cluster, n0)]
    assert (r1["gateway"], r1["dev"]) == (n0.address, "eth0"), r1
    # No VXLAN device where every peer shares the L2 segment.
    assert cluster.exec_in(n0.ns, ["ip", "link", "show", "fleet.1"]).returncode != 0

    check_pod_to_pod(cluster, ns, ("a", n0), ("b", n1))

    # Egress out of the cluster is masqueraded: a server outside (in the lan namespace,
    # which has no route to any pod CIDR) sees node 0's address.
    outside = cluster.router_address(0)
    www = cluster.base / "outside-www"
    (www / "cgi-bin").mkdir(parents=True)
    (www / "cgi-bin" / "ip").write_text("#!/bin/sh\necho Content-Type: text/plain\necho\n"
                                        "echo $REMOTE_ADDR\n")
    (www / "cgi-bin" / "ip").chmod(0o755)
    cluster.spawn_in(cluster.lan, ["busybox", "httpd", "-f", "-p", f"{outside}:18080",
                                   "-h", str(www)])
    assert wget_from(cluster, ns, "a", f"http://{outside}:18080/cgi-bin/ip") == n0.address


def test_an_agent_restart_keeps_routes_and_repairs_them(multinode: MultiNodeCluster) -> None:
    cluster = multinode
    n0, n1 = cluster.nodes
    ns = cluster.create_namespace()
    start_web(cluster, ns, "a", n0)
    start_web(cluster, ns, "b", n1)
    ip_b = cluster.wait_pod_ready(ns, "b")["status"]["podIP"]
    cluster.wait_pod_ready(ns, "a")
    cidr1 = pod_cidr(cluster, n1)
    wait_routes(cluster, n0, {cidr1})
    n0.stop()
    # The agent is down: its routes stay, pods keep talking.
    assert set(routes(cluster, n0)) == {cidr1}
    # Someone removes the route meanwhile; the restarted agent puts it back.
    cluster.exec_in(n0.ns, ["ip", "route", "del", cidr1], check=True)
    n0.start(cluster.kubeconfig)
    r = wait_routes(cluster, n0, {cidr1})[cidr1]
    assert (r["gateway"], r["dev"]) == (n1.address, "eth0")
    cluster.wait_node_ready(n0)
    assert wget_from(cluster, ns, "a", f"http://{ip_b}:8080/cgi-bin/ip") == \
        cluster.wait_pod_ready(ns, "a")["status"]["podIP"]


def test_a_node_deleted_and_registered_again_keeps_its_pod_cidr(multinode_factory: Any) -> None:
    """A Node object deleted while its agent runs: the agent
    registers again asking for the pod CIDR its pods use — not the lowest free one node
    IPAM would hand out — republishes its address, and the route comes back."""
    cluster = multinode_factory(nodes=3, agent_args=["--node-status-interval", "1"])
    cidrs = {n.name: pod_cidr(cluster, n) for n in cluster.nodes}
    # k holds the lowest range and leaves for good, so that range is free below m's.
    k = min(cluster.nodes, key=lambda n: ipaddress.IPv4Network(cidrs[n.name]))
    m, o = [n for n in cluster.nodes if n is not k]
    cluster.delete_node(k.index)
    wait_routes(cluster, o, {cidrs[m.name]})
    ns = cluster.create_namespace()
    start_web(cluster, ns, "a", o)
    start_web(cluster, ns, "b", m)
    ip_b = cluster.wait_pod_ready(ns, "b")["status"]["podIP"]
    cluster.wait_pod_ready(ns, "a")

    with cluster.client() as c:
        assert c.delete(f"/api/v1/nodes/{m.name}").status_code == 200
    # (Whether o ever sees m's route gone depends on how fast m registers again — under
    # a second here — so only the outcome is checked; a node that leaves for good takes
    # its route with it, as k showed above.)
    obj = cluster.wait_node_ready(m)
    assert obj["spec"]["podCIDR"] == cidrs[m.name], (obj["spec"], cidrs)
    # Ready can come before the agent's pod-network loop republishes its address.
    deadline = time.monotonic() + 30
    while (obj["metadata"].get("annotations") or {}).get("network.fleet.dev/public-ip") != m.address:
        assert time.monotonic() < deadline, obj["metadata"]
        time.sleep(0.3)
        obj = cluster.node_object(m) or obj
    r = wait_routes(cluster, o, {cidrs[m.name]})[cidrs[m.name]]
    assert r["gateway"] == m.address
    assert wget_from(cluster, ns, "a", f"http://{ip_b}:8080/cgi-bin/ip") == \
        cluster.wait_pod_ready(ns, "a")["status"]["podIP"]


def test_vxlan_forced_by_flag_and_a_leaving_node_takes_its_routes(multinode_factory: Any) -> None:
    cluster = multinode_factory(nodes=3, agent_args=["--network-backend", "vxlan"])
    n0, n1, n2 = cluster.nodes
    ns = cluster.create_namespace()
    for name, node in (("a", n0), ("b", n1), ("c", n2)):
        start_web(cluster, ns, name, node)
    cidrs = {n.name: pod_cidr(cluster, n) for n in cluster.nodes}

    # Every node has its VTEP published, and routes to the others through fleet.1.
    for node in cluster.nodes:
        others = {cidrs[o.name] for o in cluster.nodes if o is not node}
        got = wait_routes(cluster, node, others)
        for o in cluster.nodes:
            if o is node:
                continue
            r = got[cidrs[o.name]]
            assert (r["dev"], r["gateway"]) == ("fleet.1", cidrs[o.name].split("/")[0]), r
            assert "onlink" in r.get("flags", []), r
        ann = (cluster.node_object(node) or {})["metadata"]["annotations"]
        mac = json.loads(ann["network.fleet.dev/backend-data"])["VtepMAC"]
        link = json.loads(cluster.exec_in(node.ns, ["ip", "-j", "-d", "link", "show", "fleet.1"],
                                          check=True).stdout)[0]
        assert link["address"] == mac and link["linkinfo"]["info_data"]["id"] == 1, link
    check_pod_to_pod(cluster, ns, ("a", n0), ("b", n1))
    check_pod_to_pod(cluster, ns, ("c", n2), ("a", n0))

    # Node 2 leaves: the others drop its route, neighbour and FDB entry.
    vtep2 = cidrs[n2.name].split("/")[0]
    mac2 = json.loads((cluster.node_object(n2) or {})["metadata"]["annotations"]
                      ["network.fleet.dev/backend-data"])["VtepMAC"]
    cluster.delete_node(2)
    for node in (n0, n1):
        wait_routes(cluster, node, {cidrs[o.name] for o in (n0, n1) if o is not node})
        neigh = cluster.exec_in(node.ns, ["ip", "neigh", "show", "dev", "fleet.1"], check=True).stdout
        fdb = cluster.exec_in(node.ns, ["bridge", "fdb", "show", "dev", "fleet.1"], check=True).stdout
        assert vtep2 not in neigh and mac2 not in fdb, (neigh, fdb)
    check_pod_to_pod(cluster, ns, ("a", n0), ("b", n1))


def test_auto_backend_uses_vxlan_only_for_a_node_on_another_segment(multinode_factory: Any) -> None:
    cluster = multinode_factory(nodes=3, segments=[0, 0, 1])
    n0, n1, n2 = cluster.nodes
    ns = cluster.create_namespace()
    for name, node in (("a", n0), ("b", n1), ("c", n2)):
        start_web(cluster, ns, name, node)
    cidrs = {n.name: pod_cidr(cluster, n) for n in cluster.nodes}
    got = wait_routes(cluster, n0, {cidrs[n1.name], cidrs[n2.name]})
    assert (got[cidrs[n1.name]]["dev"], got[cidrs[n1.name]]["gateway"]) == ("eth0", n1.address)
    assert got[cidrs[n2.name]]["dev"] == "fleet.1", got
    got = wait_routes(cluster, n2, {cidrs[n0.name], cidrs[n1.name]})
    assert {r["dev"] for r in got.values()} == {"fleet.1"}, got
    check_pod_to_pod(cluster, ns, ("a", n0), ("c", n2))
    check_pod_to_pod(cluster, ns, ("b", n1), ("a", n0))


def test_killall_from_the_host_resets_a_machines_pod_network_and_nothing_else(
        multinode_factory: Any) -> None:
    """`fleet killall` run in the host's namespace for an agent that ran in another finds
    its bridge, nft table, VXLAN device and routes there — and leaves the host's link
    of the same name alone."""
    cluster = multinode_factory(nodes=2, agent_args=["--network-backend", "vxlan"])
    n0, n1 = cluster.nodes
    wait_routes(cluster, n0, {pod_cidr(cluster, n1)})
    before = cluster.exec_in(n0.ns, ["ip", "-o", "link"], check=True).stdout
    assert cluster.bridge in before and "fleet.1" in before
    sh = ["ip", "link", "add", cluster.bridge, "type", "bridge"]
    assert subprocess.run(sh, capture_output=True).returncode == 0
    try:
        # killall stops the running agent itself, holding its namespace meanwhile.
        p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "killall", "--data-dir",
                            str(n0.data_dir)], capture_output=True, text=True, env=_server_env(),
                           timeout=60)
        assert p.returncode == 0, p.stderr
        assert f"removed agent process {n0.proc.pid}" in p.stdout, p.stdout
        assert not n0.running
        assert f"removed bridge {cluster.bridge}" in p.stdout, p.stdout
        assert "removed vxlan fleet.1" in p.stdout and f"route {pod_cidr(cluster, n1)}" in p.stdout
        after = cluster.exec_in(n0.ns, ["ip", "-o", "link"], check=True).stdout
        assert cluster.bridge not in after and "fleet.1" not in after, after
        assert routes(cluster, n0) == {}
        assert cluster.exec_in(n0.ns, ["nft", "list", "tables"], check=True).stdout.strip() == ""
        # The host's bridge of the same name is still there; node 1 is untouched.
        assert subprocess.run(["ip", "link", "show", cluster.bridge],
                              capture_output=True).returncode == 0
        assert set(routes(cluster, n1)) == {pod_cidr(cluster, n0)}
    finally:
        subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)


def test_an_unknown_backend_stops_the_agent_before_it_starts(tmp_path: Any) -> None:
    p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "agent", "--server",
                        "https://127.0.0.1:1", "--data-dir", str(tmp_path / "agent"),
                        "--network-backend", "flat"], capture_output=True, text=True,
                       env=_server_env(), timeout=60)
    assert p.returncode == 1
    assert "--network-backend must be one of host-gw, vxlan, auto, not 'flat'" in p.stderr
    assert not (tmp_path / "agent").exists()


STARTER = """
import sys, time, tempfile
from pathlib import Path
from tests.e2e.multinode import MultiNodeCluster
c = MultiNodeCluster(Path(tempfile.mkdtemp(prefix="fn-reap-")), nodes=1).start()
print(c.tag, c.nodes[0].proc.pid, c.server.pid, c.base, flush=True)
time.sleep(600)
"""


def test_a_killed_test_run_leaves_nothing_after_the_next_one_reaps_it() -> None:
    from tests.e2e.multinode import problem

    if problem():
        pytest.skip(f"multi-node cluster: {problem()}")
    run = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True,
                           env=_server_env(), start_new_session=True)
    try:
        assert run.stdout is not None
        tag, agent, server, base = run.stdout.readline().split()
    finally:
        run.kill()  # the test run dies: no teardown
        run.wait(timeout=10)
    try:
        check_reaped(tag, int(agent), int(server))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def check_reaped(tag: str, agent: int, server: int) -> None:
    from fleet.runtime.procfs import proc_start_time
    from tests.e2e.multinode import reap_stale

    starts = {p: proc_start_time(p) for p in (agent, server)}
    assert all(starts.values()), "agent and server outlive the killed run"
    assert tag in reap_stale()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"fn-{tag}" not in netns
    assert subprocess.run(["ip", "link", "show", f"fn-{tag}h"], capture_output=True).returncode != 0
    deadline = time.monotonic() + 10
    while any(proc_start_time(p) == s for p, s in starts.items()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(proc_start_time(p) == s for p, s in starts.items()), "processes left running"
