"""`PeerRouter` (fleet/network/overlay.py) against the real kernel, in a namespace the
test creates (`fn-<tag>-ovl`; nothing of the machine's own network is touched):
routes follow the Nodes, only routes with the agent's protocol are ever changed, the
VXLAN device appears only when a peer needs it, and `remove` takes it all away.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.network import peers
from fleet.network.overlay import PeerRouter

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("bridge") is None,
                       reason="needs iproute2 (ip, bridge)"),
]

OWN = "198.18.77.10"


def ip(ns: str, *argv: str, check: bool = True) -> str:
    p = subprocess.run(["ip", "-n", ns, *argv], capture_output=True, text=True, timeout=20)
    if check and p.returncode != 0:
        raise AssertionError(f"ip -n {ns} {' '.join(argv)}: {p.stderr}")
    return p.stdout


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"fn-{uuid.uuid4().hex[:6]}-ovl"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # eth0 (a veth whose peer stays in the namespace): the node's underlay.
        ip(name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
        ip(name, "addr", "add", f"{OWN}/24", "dev", "eth0")
        for dev in ("eth0", "eth0p", "lo"):
            ip(name, "link", "set", dev, "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def node(name: str, cidr: str, address: str | None, mac: str | None = None) -> dict[str, Any]:
    ann = {peers.PUBLIC_IP_ANNOTATION: address} if address else {}
    if mac:
        ann[peers.BACKEND_DATA_ANNOTATION] = peers.backend_data(mac)
    return {"metadata": {"name": name, "annotations": ann}, "spec": {"podCIDR": cidr}}


def routes(ns: str, *selector: str) -> dict[str, dict[str, Any]]:
    return {r["dst"]: r for r in json.loads(ip(ns, "-j", "route", "show", *selector) or "[]")}


ME = node("me", "10.42.1.0/24", OWN)
B = node("b", "10.42.2.0/24", "198.18.77.11")
C = node("c", "10.42.3.0/24", "198.18.99.12", "0a:00:00:00:00:0c")  # another subnet


async def test_routes_follow_the_nodes_and_only_ours_are_touched(ns: str) -> None:
    # Someone else's route, and a stale one of ours from an earlier run.
    ip(ns, "route", "add", "10.42.9.0/24", "via", "198.18.77.99", "proto", "static")
    ip(ns, "route", "add", "10.42.8.0/24", "via", "198.18.77.98", "proto", "70")
    router = PeerRouter(node_name="me", pod_cidr="10.42.1.0/24", node_address=OWN,
                        host_netns=f"/run/netns/{ns}")

    assert await router.sync([ME, B]) == []
    got = routes(ns, "proto", "70")
    assert set(got) == {"10.42.2.0/24"}, got
    assert (got["10.42.2.0/24"]["gateway"], got["10.42.2.0/24"]["dev"]) == ("198.18.77.11", "eth0")
    assert "10.42.9.0/24" in routes(ns), "a route of another protocol was touched"
    assert "fleet.1" not in ip(ns, "link"), "no VXLAN device while no peer needs one"
    assert router.annotations() == {peers.PUBLIC_IP_ANNOTATION: OWN}

    # C is on another subnet: VXLAN for it (auto), host-gw for B still.
    assert await router.sync([ME, B, C]) == []
    got = routes(ns, "proto", "70")
    assert set(got) == {"10.42.2.0/24", "10.42.3.0/24"}
    vx = got["10.42.3.0/24"]
    assert (vx["gateway"], vx["dev"], "onlink" in vx["flags"]) == ("10.42.3.0", "fleet.1", True)
    link = json.loads(ip(ns, "-j", "-d", "link", "show", "fleet.1"))[0]
    info = link["linkinfo"]["info_data"]
    assert (info["id"], info["port"], info["local"], info.get("learning")) == (1, 8472, OWN, False)
    assert link["mtu"] == 1450
    assert ip(ns, "-4", "-br", "addr", "show", "fleet.1").split()[2] == "10.42.1.0/32"
    assert "10.42.3.0 lladdr 0a:00:00:00:00:0c PERMANENT" in ip(ns, "neigh", "show", "dev", "fleet.1")
    fdb = subprocess.run(["bridge", "-n", ns, "fdb", "show", "dev", "fleet.1"],
                         capture_output=True, text=True, check=True).stdout
    assert "0a:00:00:00:00:0c dst 198.18.99.12" in fdb, fdb
    ann = router.annotations()
    assert peers.parse_backend_data(ann[peers.BACKEND_DATA_ANNOTATION]) == link["address"]

    # In sync: a second pass changes nothing (same routes, no errors).
    assert await router.sync([ME, B, C]) == []
    assert routes(ns, "proto", "70") == got

    # C leaves, B moves to a new address.
    assert await router.sync([ME, node("b", "10.42.2.0/24", "198.18.77.21")]) == []
    got = routes(ns, "proto", "70")
    assert set(got) == {"10.42.2.0/24"} and got["10.42.2.0/24"]["gateway"] == "198.18.77.21"
    assert "10.42.3.0" not in ip(ns, "neigh", "show", "dev", "fleet.1")

    await router.remove()
    assert routes(ns, "proto", "70") == {}
    assert "fleet.1" not in ip(ns, "link")
    assert "10.42.9.0/24" in routes(ns)
    await router.remove()  # idempotent


async def test_a_foreign_route_to_a_peers_pod_cidr_is_left_alone(ns: str) -> None:
    ip(ns, "route", "add", "10.42.2.0/24", "via", "198.18.77.99", "proto", "static")
    router = PeerRouter(node_name="me", pod_cidr="10.42.1.0/24", node_address=OWN,
                        host_netns=f"/run/netns/{ns}")
    errors = await router.sync([ME, B])
    assert len(errors) == 1 and "10.42.2.0/24" in errors[0] and "not ours" in errors[0]
    assert routes(ns, "proto", "static")["10.42.2.0/24"]["gateway"] == "198.18.77.99"
    assert routes(ns, "proto", "70") == {}


async def test_forced_host_gw_skips_a_peer_it_cannot_reach(ns: str) -> None:
    router = PeerRouter(node_name="me", pod_cidr="10.42.1.0/24", node_address=OWN,
                        backend="host-gw", host_netns=f"/run/netns/{ns}")
    assert await router.sync([ME, B, C]) == []
    assert set(routes(ns, "proto", "70")) == {"10.42.2.0/24"}
    assert router.last is not None and "host-gw needs" in router.last.skipped["c"]
