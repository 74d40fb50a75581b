"""Stale UDP conntrack entries, against the real kernel, on the node of
`test_service_proxy` (netns and pods named `fk-*`, removed at the end even on failure).

A UDP client in pod c sends from ONE fixed source port to a ClusterIP with two
endpoints, a and b, which answer their names.  Conntrack pins the flow to the endpoint
its first datagram was DNATed to.  When that endpoint leaves the Service, the sync's
clean-up deletes the entry, so the next datagram is DNATed afresh, to the other one.
Without the clean-up the kernel keeps the old translation for as long as the client
keeps the flow alive (the entry's timeout restarts with each datagram): the removed
endpoint's server — still running, only no longer in the Service — keeps answering.
The second test shows exactly that, with the clean-up switched off.
Needs root, `ip`, `nft`, `nsenter`, busybox (see `test_service_proxy`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.network.proxy_conntrack import FlowFilter
from fleet.network.service_proxy import ServiceRules
from tests.e2e.test_service_proxy import Cluster, node_cluster
from tests.e2e.test_service_proxy import pytestmark as _node_marks

pytestmark = _node_marks

DNS_IP = "10.43.7.53"
SOURCE_PORT = 40123

# Sends a datagram every 0.1 s from one fixed source port; prints "<monotonic> <answer>"
# ("<monotonic> ERR" when nothing came back within 0.3 s).
STICKY_CLIENT = r"""
import socket, sys, time
ip, port, sport, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
u.bind(("0.0.0.0", sport))
u.settimeout(0.3)
end = time.monotonic() + seconds
while time.monotonic() < end:
    t = time.monotonic()
    try:
        u.sendto(b"q", (ip, port))
        ans = u.recv(100).decode().split()[0]
    except OSError:
        ans = "ERR"
    print(f"{t:.3f} {ans}", flush=True)
    time.sleep(0.1)
"""


def dns_service() -> dict[str, Any]:
    return {"metadata": {"namespace": "kube-system", "name": "dns"},
            "spec": {"clusterIP": DNS_IP, "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}


def dns_slice(*ips: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "kube-system", "name": "dns-1",
                         "labels": {"kubernetes.io/service-name": "dns"}},
            "addressType": "IPv4", "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": [{"addresses": [ip]} for ip in ips]}


@pytest.fixture
async def cluster(tmp_path: Path) -> Any:
    async with node_cluster(tmp_path, prefix="fk") as c:
        yield c


class Answers:
    """The sticky client's answers as they arrive: (monotonic time, pod name or ERR)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    async def start(self, nursery: trio.Nursery, netns: str, seconds: float) -> None:
        """Run the client in `netns` for `seconds`; it is killed when the nursery is."""
        proc = await trio.lowlevel.open_process(
            ["nsenter", f"--net={netns}", sys.executable, "-c", STICKY_CLIENT, DNS_IP, "53",
             str(SOURCE_PORT), str(seconds)], stdout=subprocess.PIPE)
        nursery.start_soon(self._read, proc)

    async def _read(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        try:
            buf = b""
            async for chunk in proc.stdout:
                buf += chunk
                *done, buf = buf.split(b"\n")
                for line in done:
                    t, ans = line.decode().split()
                    self.lines.append((float(t), ans))
        finally:
            proc.kill()  # our own child, by its pid (nsenter execs the client)
            with trio.CancelScope(shield=True):
                await proc.wait()

    def since(self, t0: float) -> list[str]:
        return [a for t, a in self.lines if t >= t0]

    async def wait_for(self, pred: Any, timeout: float) -> None:
        with trio.fail_after(timeout):
            while not pred():
                await trio.sleep(0.05)


async def _stuck_endpoint(cluster: Cluster, rules: ServiceRules, answers: Answers,
                          nursery: trio.Nursery, seconds: float) -> str:
    """Start the client on the two-endpoint Service; the pod its flow is pinned to."""
    c = cluster.pods["c"]
    await rules.sync([dns_service()], [dns_slice(cluster.pods["a"].ip, cluster.pods["b"].ip)])
    await answers.start(nursery, c.netns, seconds)
    await answers.wait_for(lambda: len([a for _, a in answers.lines if a != "ERR"]) >= 8, 10)
    got = {a for _, a in answers.lines if a != "ERR"}
    # One source port, one conntrack entry, one endpoint — the premise of the test.
    assert len(got) == 1, answers.lines
    return got.pop()


async def test_removed_udp_endpoint_flow_moves_to_the_other_at_once(cluster: Cluster) -> None:
    rules = cluster.rules
    assert rules is not None
    answers = Answers()
    async with trio.open_nursery() as n:
        stuck = await _stuck_endpoint(cluster, rules, answers, n, seconds=12)
        other = "b" if stuck == "a" else "a"
        t0 = time.monotonic()
        res = await rules.sync([dns_service()], [dns_slice(cluster.pods[other].ip)])
        assert res.conntrack == [FlowFilter(DNS_IP, 53, cluster.pods[stuck].ip)]
        assert res.conntrack_deleted == 1, res
        await answers.wait_for(lambda: other in answers.since(t0), 2.0)
        t_switch = next(t for t, a in answers.lines if t >= t0 and a == other)
        # From then on the flow stays on the remaining endpoint (a fresh DNAT, pinned again).
        await answers.wait_for(lambda: len(answers.since(t_switch)) >= 6, 5)
        assert set(answers.since(t_switch)) == {other}, answers.lines
        n.cancel_scope.cancel()


async def test_without_the_cleanup_the_flow_stays_on_the_removed_endpoint(cluster: Cluster) -> None:
    """The control: the same steps with the clean-up switched off (conntrack=None)."""
    rules = ServiceRules(cluster.new_rules().opts, netns=cluster.node_ns, conntrack=None)
    answers = Answers()
    async with trio.open_nursery() as n:
        stuck = await _stuck_endpoint(cluster, rules, answers, n, seconds=12)
        other = "b" if stuck == "a" else "a"
        t0 = time.monotonic()
        res = await rules.sync([dns_service()], [dns_slice(cluster.pods[other].ip)])
        assert res.conntrack == [FlowFilter(DNS_IP, 53, cluster.pods[stuck].ip)]  # computed, not run
        await trio.sleep(3)
        after = answers.since(t0)
        assert len(after) >= 10 and set(after) == {stuck}, answers.lines
        n.cancel_scope.cancel()


async def test_restarted_proxy_reconciles_the_flow_to_a_removed_endpoint(cluster: Cluster) -> None:
    """The endpoint leaves while the proxy is down: the new proxy's first sync knows no
    previous state, so it reconciles — flows to the Service not answered by one of its
    serving endpoints go."""
    rules = cluster.rules
    assert rules is not None
    answers = Answers()
    async with trio.open_nursery() as n:
        stuck = await _stuck_endpoint(cluster, rules, answers, n, seconds=12)
        other = "b" if stuck == "a" else "a"
        restarted = cluster.new_rules()
        t0 = time.monotonic()
        res = await restarted.sync([dns_service()], [dns_slice(cluster.pods[other].ip)])
        assert res.kind == "full"
        assert res.conntrack == [FlowFilter(DNS_IP, 53, keep=frozenset({cluster.pods[other].ip}))]
        assert res.conntrack_deleted == 1, res
        await answers.wait_for(lambda: other in answers.since(t0), 2.0)
        n.cancel_scope.cancel()


async def test_udp_service_gets_its_first_endpoint_while_a_client_sends(cluster: Cluster) -> None:
    """No endpoints (rejected) → one: the same client flow is answered within a second
    or two (the clean-up deletes entries to the ClusterIP:port; in nftables mode the
    rejected datagrams' entries are mostly never confirmed, so this shows the path
    end to end rather than the clean-up alone)."""
    rules = cluster.rules
    assert rules is not None
    a, c = cluster.pods["a"], cluster.pods["c"]
    await rules.sync([dns_service()], [dns_slice()])
    answers = Answers()
    async with trio.open_nursery() as n:
        await answers.start(n, c.netns, 10)
        await answers.wait_for(lambda: len(answers.lines) >= 4, 10)
        assert {x for _, x in answers.lines} == {"ERR"}, answers.lines
        t0 = time.monotonic()
        res = await rules.sync([dns_service()], [dns_slice(a.ip)])
        assert res.conntrack == [FlowFilter(DNS_IP, 53)]
        await answers.wait_for(lambda: "a" in answers.since(t0), 2.0)
        n.cancel_scope.cancel()
