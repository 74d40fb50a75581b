"""NodePorts: host port conflicts, with kube-scheduler's 0.0.0.0 rules (node_ports_test.go)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.scheduler.framework import Code, CycleState
from fleet.scheduler.plugins import NodePorts
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import filter_nodes, node, pod

REASON = "node(s) didn't have free ports for the requested pod ports"


def port_pod(*ports: str, name: str = "p", node_name: str | None = None, **kw: Any) -> dict[str, Any]:
    """Ports spelled "PROTO/IP/PORT" (IP may be empty)."""
    specs = []
    for spec in ports:
        proto, ip, port = spec.split("/")
        entry: dict[str, Any] = {"containerPort": 80, "hostPort": int(port), "protocol": proto}
        if ip:
            entry["hostIP"] = ip
        specs.append(entry)
    return pod(name, node_name=node_name,
               containers=[{"name": "c", "image": "busybox", "ports": specs}], **kw)


@pytest.mark.parametrize(("existing", "wanted", "fits"), [
    ([], ["UDP/127.0.0.1/8080"], True),
    (["UDP/127.0.0.1/8080"], ["UDP/127.0.0.1/8080"], False),
    (["TCP/127.0.0.1/8080"], ["TCP/127.0.0.1/8080"], False),
    (["TCP/127.0.0.1/8080"], ["UDP/127.0.0.1/8080"], True),  # different protocol
    (["TCP/127.0.0.1/8001"], ["TCP/127.0.0.2/8001"], True),  # different IP
    (["TCP/127.0.0.1/8080", "UDP/127.0.0.1/8081"], ["UDP/127.0.0.1/8080", "UDP/127.0.0.1/8081"], False),
    # 0.0.0.0 on either side conflicts with every IP of that protocol/port.
    (["TCP/0.0.0.0/8001"], ["TCP/127.0.0.1/8001"], False),
    (["TCP/127.0.0.1/8001"], ["TCP/0.0.0.0/8001"], False),
    (["TCP/127.0.0.1/8001"], ["TCP//8001"], False),  # no hostIP means 0.0.0.0
    (["TCP/0.0.0.0/8001"], ["UDP/127.0.0.1/8001"], True),
    (["UDP/0.0.0.0/8001"], ["TCP/0.0.0.0/8001"], True),
    (["TCP/10.0.10.10/8001", "TCP/0.0.0.0/8001"], ["TCP/127.0.0.1/8001"], False),
])
def test_host_port_conflicts(existing, wanted, fits):
    bound = [port_pod(*existing, name="existing", node_name="n1")] if existing else []
    st = filter_nodes(NodePorts(), port_pod(*wanted), Snapshot.build([node("n1")], bound))["n1"]
    if fits:
        assert st.ok
    else:
        assert st.code is Code.UNSCHEDULABLE and st.reasons == (REASON,)


def test_protocol_defaults_to_tcp():
    existing = pod("e", node_name="n1", containers=[{"name": "c", "ports": [{"containerPort": 1, "hostPort": 53}]}])
    st = filter_nodes(NodePorts(), port_pod("TCP//53"), Snapshot.build([node("n1")], [existing]))
    assert not st["n1"].ok


def test_pods_without_host_ports_skip():
    p = pod(containers=[{"name": "c", "ports": [{"containerPort": 80}]}])
    assert NodePorts().pre_filter(CycleState(), p).code is Code.SKIP


def test_sidecars_hold_ports_and_ports_free_up():
    sidecar = pod("side", node_name="n1", init=[{"name": "s", "restartPolicy": "Always",
                                                 "ports": [{"containerPort": 1, "hostPort": 9000}]}])
    snap = Snapshot.build([node("n1")], [sidecar])
    assert not filter_nodes(NodePorts(), port_pod("TCP//9000"), snap)["n1"].ok
    snap.remove_pod("default/side")
    assert filter_nodes(NodePorts(), port_pod("TCP//9000"), snap)["n1"].ok
    # A finished pod holds nothing.
    snap.set_pod(port_pod("TCP//9000", name="done", node_name="n1", phase="Succeeded"))
    assert filter_nodes(NodePorts(), port_pod("TCP//9000"), snap)["n1"].ok
