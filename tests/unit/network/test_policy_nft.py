"""The NetworkPolicy table (fleet.network.policy_nft): its text, its sets' meaning, and —
as root with nft — that the kernel takes it and that it lets through exactly what the
rules say, between two network namespaces joined by a veth pair."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.network import nft
from fleet.network.policy import Allow, PodRules, PortRange, allowed
from fleet.network.policy_nft import (
    TABLE,
    delete_script,
    deny_all,
    disjoint_elements,
    merged_addresses,
    render,
)

needs_root_nft = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, nftables)"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft installed"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (ip netns)"),
]

RULES = PodRules(
    ingress_isolated=True, egress_isolated=False,
    ingress=(Allow(("10.0.0.0/24", "fd00::/64"), (PortRange("TCP", 80, 80), PortRange("UDP", 53, 60))),
             Allow(("10.0.0.7/32",), (PortRange("TCP", 70, 90),)),
             Allow(("192.168.1.0/24",))),
    policies=("default/p",))


def _chain(script: str, name: str) -> str:
    start = script.index(f"chain {name} {{")
    return script[start:script.index("}", start)]


def test_render_structure() -> None:
    script = render(RULES, always_allow=["10.0.0.1", "192.168.0.10", "fe80::1"])
    assert script.splitlines()[:3] == [f"table inet {TABLE}", f"delete table inet {TABLE}",
                                       f"table inet {TABLE} {{"]
    inp, out = _chain(script, "input"), _chain(script, "output")
    assert "type filter hook input priority filter; policy drop;" in inp
    # Order matters: established first (cheap), then invalid, loopback, the node.
    order = ["ct state established,related accept", "ct state invalid drop", 'iif "lo" accept',
             "ip saddr @always_allow accept", "ip saddr @ingress_any accept",
             "ip saddr . meta l4proto . th dport @ingress_ports accept"]
    assert [inp.index(r) for r in order] == sorted(inp.index(r) for r in order)
    # The non-isolated direction accepts everything and has no sets.
    assert "policy accept;" in out and "accept\n" not in out.split("policy accept;")[1]
    assert "egress_" not in script
    assert "type ipv4_addr . inet_proto . inet_service" in script and "flags interval" in script
    # The overlapping boxes come out disjoint; IPv6 is skipped.
    for element in ("10.0.0.0-10.0.0.6 . tcp . 80", "10.0.0.7 . tcp . 70-90",
                    "10.0.0.8-10.0.0.255 . tcp . 80", "10.0.0.0/24 . udp . 53-60"):
        assert f"      {element},\n" in script
    assert "fd00" not in script and "fe80" not in script
    assert "192.168.1.0/24" in script


def test_render_without_always_allow_and_both_isolated() -> None:
    script = render(PodRules(ingress_isolated=True, egress_isolated=True))
    assert "always_allow" not in script
    assert _chain(script, "output").count("policy drop;") == 1
    assert 'oif "lo" accept' in script and "ip daddr . meta l4proto . th dport @egress_ports" in script
    assert "elements" not in script  # isolated, nothing allowed: empty sets


def test_deny_all_structure() -> None:
    script = deny_all(always_allow=["10.0.0.1"])
    for chain in ("input", "output"):
        body = _chain(script, chain)
        assert "policy drop;" in body and "established" not in body
    assert "ip saddr @always_allow accept" in script and "ip daddr @always_allow accept" in script
    assert "always_allow" not in deny_all()
    assert delete_script() == f"table inet {TABLE}\ndelete table inet {TABLE}\n"


# ------------------------------------------------------------------------------------------
# The sets mean what `allowed` means (pure: no kernel needed)

SMALL_CIDRS = st.sampled_from(["10.0.0.0/28", "10.0.0.0/30", "10.0.0.4/30", "10.0.0.5/32",
                               "10.0.0.8/29", "10.0.0.15/32", "0.0.0.0/0", "fd00::/64"])
ranges = st.builds(lambda proto, first, width: PortRange(proto, first, first + width),
                   st.sampled_from(["TCP", "UDP", "SCTP"]), st.integers(1, 12), st.integers(0, 4))
allows = st.builds(Allow, st.lists(SMALL_CIDRS, min_size=1, max_size=3).map(tuple),
                   st.lists(ranges, max_size=3).map(tuple))
rule_sets = st.builds(PodRules, st.booleans(), st.booleans(),
                      st.lists(allows, max_size=4).map(tuple), st.lists(allows, max_size=4).map(tuple))


@settings(max_examples=200, deadline=None)
@given(st.lists(allows, max_size=5))
def test_disjoint_elements_cover_exactly_what_allowed_says(items: list[Allow]) -> None:
    boxes = disjoint_elements(items)
    for i, (a, pa, qa) in enumerate(boxes):
        for b, pb, qb in boxes[i + 1:]:
            overlap = pa == pb and a[0] <= b[1] and b[0] <= a[1] and qa[0] <= qb[1] and qb[0] <= qa[1]
            assert not overlap, (a, pa, qa, b, pb, qb)
    any_spans = merged_addresses(c for a in items if not a.ports for c in a.cidrs)
    rules = PodRules(ingress_isolated=True, ingress=tuple(items))
    for host in range(0, 18):
        ip = int(ipaddress.IPv4Address("10.0.0.0")) + host
        for proto in ("TCP", "UDP", "SCTP"):
            for port in range(0, 18):
                in_sets = any(lo <= ip <= hi for lo, hi in any_spans) or any(
                    a[0] <= ip <= a[1] and p == proto and q[0] <= port <= q[1] for a, p, q in boxes)
                assert in_sets == allowed(rules, "ingress", str(ipaddress.IPv4Address(ip)), proto, port)


# ------------------------------------------------------------------------------------------
# The kernel (root)


def _netns(tag: str) -> str:
    name = f"np12-{tag}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    return name


def _del_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def ns() -> Iterator[str]:
    name = _netns("chk")
    try:
        yield f"/run/netns/{name}"
    finally:
        _del_netns(name)


class TestKernel:
    pytestmark = needs_root_nft

    @settings(max_examples=25, deadline=None)
    @given(rules=rule_sets, always=st.lists(st.sampled_from(["10.1.0.1", "10.0.0.1/32", "::1"]), max_size=2))
    def test_nft_accepts_rendered_scripts(self, rules: PodRules, always: list[str]) -> None:
        name = _netns("chk")
        try:
            path = f"/run/netns/{name}"
            nft.run_nft_sync(["-c", "-f", "-"], stdin=render(rules, always_allow=always).encode(),
                             netns=path)
            # Loaded for real, twice: the second load replaces the first.
            for _ in range(2):
                nft.run_nft_sync(["-f", "-"], stdin=render(rules, always_allow=always).encode(),
                                 netns=path)
            assert nft.list_tables_sync("inet", netns=path) == [TABLE]
        finally:
            _del_netns(name)

    def test_deny_all_and_delete_load(self, ns: str) -> None:
        nft.run_nft_sync(["-f", "-"], stdin=deny_all(always_allow=["10.0.0.1"]).encode(), netns=ns)
        assert nft.list_tables_sync("inet", netns=ns) == [TABLE]
        nft.run_nft_sync(["-f", "-"], stdin=delete_script().encode(), netns=ns)
        nft.run_nft_sync(["-f", "-"], stdin=delete_script().encode(), netns=ns)  # idempotent
        assert nft.list_tables_sync("inet", netns=ns) == []


# ------------------------------------------------------------------------------------------
# Real traffic: client netns --veth-- server netns

SERVER_IP, CLIENT_IP = "10.212.12.1", "10.212.12.2"
SERVER = """
import socket, sys, time
socks = []
for port in (8080, 8081):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64); s.setblocking(False); socks.append(s)
print("ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    for s in socks:
        try:
            c, _ = s.accept(); c.close()
        except BlockingIOError:
            pass
    time.sleep(0.01)
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.7).close()
except OSError:
    sys.exit(1)
"""


@pytest.fixture
def pair() -> Iterator[tuple[str, str]]:
    """(server netns path, client netns path), joined by a veth; a TCP server listening
    on 8080 and 8081 in the server netns."""
    srv, cli = _netns("srv"), _netns("cli")
    proc: subprocess.Popen[str] | None = None
    try:
        veth = f"np12v{uuid.uuid4().hex[:6]}"
        run = lambda *a: subprocess.run(list(a), check=True)  # noqa: E731
        run("ip", "link", "add", veth, "netns", srv, "type", "veth", "peer", "name", "eth0", "netns", cli)
        run("ip", "-n", srv, "link", "set", veth, "name", "eth0")
        for ns, ip in ((srv, SERVER_IP), (cli, CLIENT_IP)):
            run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        proc = subprocess.Popen(["ip", "netns", "exec", srv, sys.executable, "-c", SERVER],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"/run/netns/{srv}", f"/run/netns/{cli}"
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(timeout=5)
        _del_netns(srv)
        _del_netns(cli)


def _connects(client: str, port: int) -> bool:
    name = os.path.basename(client)
    return subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", CONNECT, SERVER_IP,
                           str(port)], check=False, timeout=10).returncode == 0


def _load(netns: str, script: str) -> None:
    nft.run_nft_sync(["-f", "-"], stdin=script.encode(), netns=netns)


class TestTraffic:
    pytestmark = needs_root_nft

    def test_connections_follow_the_rules(self, pair: tuple[str, str]) -> None:
        server, client = pair
        assert _connects(client, 8080) and _connects(client, 8081)  # no table: open
        # Ingress on the server: the client may reach 8080 only.
        only_8080 = PodRules(ingress_isolated=True,
                             ingress=(Allow((f"{CLIENT_IP}/32",), (PortRange("TCP", 8080, 8080),)),))
        _load(server, render(only_8080))
        assert _connects(client, 8080)
        assert not _connects(client, 8081)
        # Other peers only: nothing from the client.
        _load(server, render(PodRules(ingress_isolated=True,
                                      ingress=(Allow(("10.212.13.0/24",)),))))
        assert not _connects(client, 8080)
        # The client's address as the node's (always allowed) opens everything again.
        _load(server, render(PodRules(ingress_isolated=True), always_allow=[CLIENT_IP]))
        assert _connects(client, 8081)
        # Isolated egress on the server blocks nothing inbound (replies are established).
        _load(server, render(PodRules(egress_isolated=True)))
        assert _connects(client, 8080)
        # Strict mode's table: closed.
        _load(server, deny_all())
        assert not _connects(client, 8080)
        _load(server, delete_script())
        assert _connects(client, 8080)

    def test_egress_rules_on_the_client(self, pair: tuple[str, str]) -> None:
        _server, client = pair
        to_8081 = PodRules(egress_isolated=True,
                           egress=(Allow((f"{SERVER_IP}/32",), (PortRange("TCP", 8081, 8081),)),))
        _load(client, render(to_8081))
        assert _connects(client, 8081)
        assert not _connects(client, 8080)
        _load(client, render(PodRules(egress_isolated=True,
                                      egress=(Allow(("10.212.12.0/24",)),))))
        assert _connects(client, 8080)
