"""Simulated nodes against a real `fleet server --no-agent`.

In-process (`Simulator` in the test's nursery): nodes register Ready with Leases
that keep being renewed; pods created without a node are bound by the server's
scheduler and go Running with addresses; deleted pods disappear; pausing one
node's heartbeats stops only its Lease.  As a subprocess (`fleet agent
--simulate N`): the CLI registers its nodes and its control endpoint pauses one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio

from fleet.agent.simulate import SIMULATED_LABEL, Simulator, SimulatorConfig
from fleet.client import ApiException, Client, load_kubeconfig
from tests.conftest import REPO_ROOT, FleetServer, ServerFactory

T = TypeVar("T")
LEASES = ("coordination.k8s.io/v1", "leases")
NS = "default"


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = 30.0,
                     what: str = "condition") -> T:
    last: Any = None
    with trio.move_on_after(timeout):
        while True:
            last = await check()
            if last:
                return last
            await trio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


async def renew_times(client: Client) -> dict[str, str]:
    leases = await client.list(*LEASES, "kube-node-lease")
    return {le["metadata"]["name"]: le["spec"]["renewTime"] for le in leases["items"]}


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27",
                                     "resources": {"requests": {"cpu": "100m"}}}], **spec}}


@pytest.fixture
def server(fleet_server_factory: ServerFactory) -> FleetServer:
    return fleet_server_factory.start()


async def test_simulated_nodes_run_pods(server: FleetServer) -> None:
    cfg = load_kubeconfig(str(server.kubeconfig))
    sim = Simulator(SimulatorConfig(count=12, zones=3, lease_interval=1.0,
                                    node_status_interval=5.0, start_delay=0.2), cfg)
    async with Client(cfg) as client, trio.open_nursery() as nursery:
        await nursery.start(sim.run)

        # -- registration: Ready nodes with zones, and a Lease each ---------------------
        nodes = (await client.list("v1", "nodes", label_selector=f"{SIMULATED_LABEL}=true"))["items"]
        assert sorted(n["metadata"]["name"] for n in nodes) == sim.node_names
        for n in nodes:
            ready = {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"]
            assert ready == "True"
        zones = {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
        assert zones == {"zone-a", "zone-b", "zone-c"}
        first = await renew_times(client)
        assert set(sim.node_names) <= set(first)

        async def all_renewed() -> bool:
            now = await renew_times(client)
            return all(now[n] != first[n] for n in sim.node_names)
        await eventually(all_renewed, what="every lease renewed")

        # -- pods: the server's scheduler binds them, the simulator runs them -----------
        for i in range(12):
            await client.create("v1", "pods", pod(f"web-{i}"), namespace=NS)
        # A pod bound to a node the simulator does not own is left alone.
        await client.create("v1", "pods", pod("pinned", nodeName="real-node"), namespace=NS)

        async def running() -> list[dict[str, Any]]:
            items = (await client.list("v1", "pods", NS, label_selector=None))["items"]
            web = [p for p in items if p["metadata"]["name"].startswith("web-")]
            ok = len(web) == 12 and all(p["status"].get("phase") == "Running" for p in web)
            return web if ok else []
        web = await eventually(running, what="12 pods Running")
        ips = {p["status"]["podIP"] for p in web}
        assert len(ips) == 12
        assert all(p["spec"]["nodeName"] in sim.nodes for p in web)
        for p in web:
            node = sim.nodes[p["spec"]["nodeName"]]
            assert p["status"]["hostIP"] == node.address
            ready = {c["type"]: c["status"] for c in p["status"]["conditions"]}
            assert ready["Ready"] == ready["ContainersReady"] == "True"
        pinned = await client.get_object("v1", "pods", "pinned", NS)
        assert pinned["status"].get("phase") == "Pending"

        # -- deletion: graceful delete, finalized by the simulated kubelet -------------
        await client.delete("v1", "pods", "web-0", NS)

        async def gone() -> bool:
            try:
                await client.get_object("v1", "pods", "web-0", NS)
            except ApiException as e:
                return e.code == 404
            return False
        await eventually(gone, what="web-0 deleted")

        # -- one node's heartbeats paused: only its Lease stops ------------------------
        sim.pause_heartbeats("sim-0003")
        await trio.sleep(1.5)  # a renewal in flight may still land
        before = await renew_times(client)

        async def others_renewed() -> bool:
            now = await renew_times(client)
            return all(now[n] != before[n] for n in sim.node_names if n != "sim-0003")
        await eventually(others_renewed, what="the other leases renewed")
        assert (await renew_times(client))["sim-0003"] == before["sim-0003"]
        sim.resume_heartbeats("sim-0003")

        async def paused_renewed() -> bool:
            return (await renew_times(client))["sim-0003"] != before["sim-0003"]
        await eventually(paused_renewed, what="sim-0003 renewing again")
        nursery.cancel_scope.cancel()


def test_cli_simulate(server: FleetServer, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    log_path = tmp_path / "simulator.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", "agent", "--simulate", "5",
             "--kubeconfig", str(server.kubeconfig), "--node-name", "edge",
             "--simulate-zones", "2", "--lease-interval", "1",
             "--simulate-control-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    try:
        control = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and control is None:
            assert proc.poll() is None, log_path.read_text()
            m = re.search(r"Simulator control endpoint on (http://\S+)", log_path.read_text())
            control = m.group(1) if m else None
            time.sleep(0.1)
        assert control, log_path.read_text()
        assert "Simulating 5 nodes (edge-0000 .. edge-0004)" in log_path.read_text()
        with server.client() as c:
            nodes = c.get("/api/v1/nodes", params={"labelSelector": f"{SIMULATED_LABEL}=true"}).json()
            names = sorted(n["metadata"]["name"] for n in nodes["items"])
            assert names == [f"edge-000{i}" for i in range(5)]
            zones = [n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes["items"]]
            assert sorted(zones) == ["zone-a"] * 3 + ["zone-b"] * 2
        r = httpx.post(f"{control}/nodes/edge-0001/pause", timeout=10)
        assert r.status_code == 200 and r.json()["paused"] is True
        listing = httpx.get(f"{control}/nodes", timeout=10).json()["nodes"]
        assert [n["name"] for n in listing if n["paused"]] == ["edge-0001"]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
