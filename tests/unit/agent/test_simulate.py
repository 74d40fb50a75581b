"""Simulated nodes (fleet.agent.simulate): the pure parts table by table, the timer heap
under MockClock, and a Simulator against the real API pipeline in-process."""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import trio
import trio.testing

from fleet.agent.simulate import (
    EXIT_AFTER_ANNOTATION,
    EXIT_CODE_ANNOTATION,
    SIMULATED_LABEL,
    AddressBlock,
    Simulator,
    SimulatorConfig,
    TimerQueue,
    exit_plan,
    exited_status,
    fallback_pod_cidr,
    first_due,
    make_nodes,
    next_due,
    node_names,
    node_object,
    running_status,
    slim_pod,
    zone_names,
)
from fleet.api.registry import default_registry
from fleet.client import Client, ClientConfig
from fleet.server.http import Req
from fleet.testing.apiserver import TOKEN, InProcessAPI, open_api

# --------------------------------------------------------------------------- names, zones, shapes


@pytest.mark.parametrize(("prefix", "count", "first", "last"), [
    ("sim", 1, "sim-0000", "sim-0000"),
    ("sim", 1000, "sim-0000", "sim-0999"),
    ("n", 10001, "n-00000", "n-10000"),
])
def test_node_names(prefix: str, count: int, first: str, last: str) -> None:
    names = node_names(prefix, count)
    assert (names[0], names[-1], len(set(names))) == (first, last, count)
    assert names == sorted(names)


def test_zone_names() -> None:
    assert zone_names(3) == ["zone-a", "zone-b", "zone-c"]
    assert zone_names(28)[25:] == ["zone-z", "zone-27", "zone-28"]


@pytest.mark.parametrize("zones", [1, 2, 3, 4])
def test_zones_round_robin_and_every_zone_gets_every_shape(zones: int) -> None:
    cfg = SimulatorConfig(count=8 * zones, zones=zones)
    nodes = make_nodes(cfg)
    for z in zone_names(zones):
        in_zone = [n for n in nodes if n.zone == z]
        assert len(in_zone) == 8
        assert {n.shape.cpu for n in in_zone} == {4, 8, 16, 32}
    assert len({n.address for n in nodes}) == len(nodes)


def test_node_object_is_a_valid_ready_node() -> None:
    cfg = SimulatorConfig(count=5, labels={"team": "sched"})
    node = make_nodes(cfg)[4]
    obj = node_object(cfg, node, boot_id="b", now="2026-01-01T00:00:00Z")
    labels = obj["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "sim-0004"
    assert labels["topology.kubernetes.io/zone"] == "zone-b"
    assert labels["topology.kubernetes.io/region"] == "region-1"
    assert labels["node.kubernetes.io/instance-type"] == "sim.2xlarge"
    assert labels[SIMULATED_LABEL] == "true" and labels["team"] == "sched"
    status = obj["status"]
    assert status["capacity"] == {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "200Gi",
                                  "pods": "110"}
    assert status["allocatable"]["memory"] == f"{32 * 1024 - 100}Mi"
    ready = {c["type"]: c["status"] for c in status["conditions"]}
    assert ready == {"Ready": "True", "MemoryPressure": "False", "DiskPressure": "False",
                     "PIDPressure": "False"}
    assert status["addresses"][0] == {"type": "InternalIP", "address": "198.18.0.5"}
    assert status["nodeInfo"]["kubeletVersion"]
    info = default_registry().get("", "v1", "nodes")
    assert info is not None and info.validate is not None
    assert info.validate(obj, None) == []


# --------------------------------------------------------------------------- heartbeat phases


@pytest.mark.parametrize(("index", "after", "expect"), [
    (0, 0.0, 10.0),  # strictly after: not again at once
    (1, 0.0, 1.0),
    (1, 1.0, 11.0),
    (1, 1.5, 11.0),
    (9, 35.0, 39.0),
    (0, 35.0, 40.0),
    (0, -3.0, 0.0),
])
def test_first_due_is_the_nodes_phase(index: int, after: float, expect: float) -> None:
    assert first_due(index, 10, 10.0, 0.0, after) == pytest.approx(expect)


def test_first_due_spreads_nodes_evenly_whenever_they_register() -> None:
    # Registration order and speed do not matter: each node keeps its slot.
    dues = sorted(first_due(i, 1000, 10.0, 0.0, after=i * 0.037) % 10.0
                  for i in range(1000))
    gaps = [b - a for a, b in zip(dues, dues[1:], strict=False)]
    assert max(gaps) == pytest.approx(0.01) and min(gaps) == pytest.approx(0.01)


@pytest.mark.parametrize(("previous", "now", "expect"), [
    (0.0, 3.0, 10.0),   # on time
    (0.0, 10.0, 20.0),  # exactly at the next slot: that one is past
    (0.0, 25.0, 30.0),  # fell behind: skip to the next slot at the same phase
    (2.0, 2.1, 12.0),
])
def test_next_due_keeps_the_phase(previous: float, now: float, expect: float) -> None:
    assert next_due(previous, 10.0, now) == pytest.approx(expect)


# --------------------------------------------------------------------------- addresses


def test_address_block_allocates_hosts_and_reuses_released() -> None:
    b = AddressBlock("10.42.7.0/24")
    ips = [b.allocate() for _ in range(253)]
    assert ips[0] == "10.42.7.2" and ips[-1] == "10.42.7.254"
    assert b.allocate() is None
    assert b.release("10.42.7.100") and not b.release("10.42.7.100")
    assert b.allocate() == "10.42.7.100"
    assert not b.release("10.42.8.3") and not b.claim("10.1.1.1")


def test_pods_use_the_node_pod_cidr_else_a_private_range() -> None:
    a, b = make_nodes(SimulatorConfig(count=300))[:2]
    assert a.allocate_ip() == "100.64.0.2"
    assert b.allocate_ip() == "100.64.1.2"
    b.pod_cidr = "10.42.3.0/24"
    assert b.allocate_ip() == "10.42.3.2"
    b.release_ip("100.64.1.2")
    b.claim_ip("10.42.3.3")
    assert b.allocate_ip() == "10.42.3.4"
    nets = {ipaddress.ip_network(fallback_pod_cidr(i)) for i in range(16384)}
    assert len(nets) == 16384
    assert all(n.subnet_of(ipaddress.ip_network("100.64.0.0/10")) for n in nets)


def test_a_full_pod_cidr_borrows_from_the_private_range() -> None:
    node = make_nodes(SimulatorConfig(count=1))[0]
    node.pod_cidr = "10.42.0.0/30"  # room for one pod (.2)
    assert node.allocate_ip() == "10.42.0.2"
    assert node.allocate_ip() == "100.64.0.2"


# --------------------------------------------------------------------------- pod status


def pod(name: str = "p", *, restart: str = "Always", annotations: dict[str, str] | None = None,
        init: bool = False, node: str = "sim-0000") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "restartPolicy": restart,
                            "containers": [{"name": "app", "image": "nginx:1.27"},
                                           {"name": "side", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [{"name": "setup", "image": "busybox"},
                                  {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": "0123456789abcdef",
                         "annotations": annotations or {}},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "T0"}]}}


def test_running_status() -> None:
    s = running_status(pod(init=True), pod_ip="10.42.0.5", host_ip="198.18.0.1", now="T1")
    assert s["phase"] == "Running"
    assert (s["podIP"], s["podIPs"], s["hostIP"], s["startTime"]) == (
        "10.42.0.5", [{"ip": "10.42.0.5"}], "198.18.0.1", "T1")
    conds = {c["type"]: c for c in s["conditions"]}
    assert {k: c["status"] for k, c in conds.items()} == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"}
    assert conds["PodScheduled"]["lastTransitionTime"] == "T0"  # kept from the binding
    assert [(c["name"], c["ready"], list(c["state"])) for c in s["containerStatuses"]] == [
        ("app", True, ["running"]), ("side", True, ["running"])]
    assert [list(c["state"]) for c in s["initContainerStatuses"]] == [["terminated"], ["running"]]
    assert s["containerStatuses"][0]["imageID"].startswith("nginx@sha256:")
    assert s["containerStatuses"][0]["containerID"] == "sim://01234567-app"


def test_slim_pod_gives_the_same_status() -> None:
    full = pod(init=True, restart="Never", annotations={EXIT_AFTER_ANNOTATION: "3", "x": "y"})
    full["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    full["spec"]["containers"][0]["env"] = [{"name": "BIG", "value": "x" * 1000}]
    full["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    slim = slim_pod(full)
    assert len(json.dumps(slim)) < len(json.dumps(full)) / 2
    kw = {"pod_ip": "10.0.0.2", "host_ip": "h", "now": "T"}
    assert running_status(slim, **kw) == running_status(full, **kw)
    assert exited_status(slim, started="S", exit_code=1, **kw) == exited_status(
        full, started="S", exit_code=1, **kw)
    assert exit_plan(slim) == exit_plan(full) == (3.0, 0)


@pytest.mark.parametrize(("restart", "code", "phase"), [
    ("Never", 0, "Succeeded"), ("Never", 3, "Failed"), ("OnFailure", 0, "Succeeded")])
def test_exited_status(restart: str, code: int, phase: str) -> None:
    s = exited_status(pod(restart=restart), pod_ip="10.42.0.5", host_ip="h", started="T1",
                      exit_code=code, now="T2")
    assert s["phase"] == phase
    term = s["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["startedAt"], term["finishedAt"]) == (code, "T1", "T2")
    assert {c["type"]: c["status"] for c in s["conditions"]}["Ready"] == "False"


@pytest.mark.parametrize(("restart", "ann", "expect"), [
    ("Always", {EXIT_AFTER_ANNOTATION: "5"}, None),
    ("Never", {}, None),
    ("Never", {EXIT_AFTER_ANNOTATION: "5"}, (5.0, 0)),
    ("Never", {EXIT_AFTER_ANNOTATION: "0.5", EXIT_CODE_ANNOTATION: "2"}, (0.5, 2)),
    ("OnFailure", {EXIT_AFTER_ANNOTATION: "1"}, (1.0, 0)),
    ("OnFailure", {EXIT_AFTER_ANNOTATION: "1", EXIT_CODE_ANNOTATION: "1"}, None),
    ("Never", {EXIT_AFTER_ANNOTATION: "soon"}, None),
    ("Never", {EXIT_AFTER_ANNOTATION: "-3"}, (0.0, 0)),
])
def test_exit_plan(restart: str, ann: dict[str, str], expect: tuple[float, int] | None) -> None:
    assert exit_plan(pod(restart=restart, annotations=ann)) == expect


def test_config_validation() -> None:
    for bad in (SimulatorConfig(count=0), SimulatorConfig(zones=0),
                SimulatorConfig(lease_interval=0), SimulatorConfig(start_delay=-1),
                SimulatorConfig(count=100_000)):
        with pytest.raises(ValueError):
            bad.validate()
    assert SimulatorConfig(count=10).lease_workers == 8
    assert SimulatorConfig(count=5000).lease_workers == 50
    assert SimulatorConfig(count=16000).lease_workers == 64


# --------------------------------------------------------------------------- the timer heap


async def test_timer_queue_fires_in_order_and_on_ticks(autojump_clock: trio.testing.MockClock) -> None:
    fired: list[tuple[str, float]] = []
    q = TimerQueue()
    ticked = TimerQueue(granularity=0.25)
    async with trio.open_nursery() as n:
        n.start_soon(q.run, lambda k: fired.append((k, trio.current_time())))
        n.start_soon(ticked.run, lambda k: fired.append((k, trio.current_time())))
        t0 = trio.current_time()
        q.push(t0 + 3, "c")
        q.push(t0 + 1, "a")
        await trio.sleep(0.5)
        q.push(t0 + 2, "b")  # earlier than what the task sleeps for: wakes it
        ticked.push(t0 + 1.1, "t1")
        ticked.push(t0 + 1.2, "t2")
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert [k for k, _ in fired] == ["a", "t1", "t2", "b", "c"]
    times = {k: t - t0 for k, t in fired}
    assert times["a"] == pytest.approx(1) and times["c"] == pytest.approx(3)
    assert times["t1"] == pytest.approx(1.25) and times["t2"] == pytest.approx(1.25)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# --------------------------------------------------------------------------- in-process API


class _Body(httpx.AsyncByteStream):
    def __init__(self, it: AsyncIterator[bytes]) -> None:
        self._it = it

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._it:
            yield chunk

    async def aclose(self) -> None:
        aclose = getattr(self._it, "aclose", None)
        if aclose is not None:
            await aclose()


class InProcessTransport(httpx.AsyncBaseTransport):
    """httpx → APIServer.handle without sockets (watch streams included)."""

    def __init__(self, api: InProcessAPI) -> None:
        self.api = api

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        query = dict(parse_qsl(request.url.query.decode(), keep_blank_values=True))
        headers = {k.decode().lower(): v.decode() for k, v in request.headers.raw}
        resp, _, _ = await self.api.server.handle(
            Req(request.method, request.url.path, query, headers, body))
        out_headers = {"content-type": resp.content_type, **resp.headers}
        if isinstance(resp.body, bytes):
            return httpx.Response(resp.status, content=resp.body, headers=out_headers)
        return httpx.Response(resp.status, stream=_Body(resp.body), headers=out_headers)


PODS = "/api/v1/namespaces/default/pods"


def plain_pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


async def bind(api: InProcessAPI, name: str, node: str) -> None:
    code, body = await api.json("POST", f"{PODS}/{name}/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    assert code == 201, body


async def eventually(check: Any, timeout: float = 10.0) -> Any:
    with trio.fail_after(timeout):
        while True:
            got = await check()
            if got:
                return got
            await trio.sleep(0.02)


@asynccontextmanager
async def running_simulator(tmp_path: Any, **kw: Any) -> AsyncIterator[tuple[InProcessAPI, Simulator]]:
    async with open_api(tmp_path) as api:
        opts: dict[str, Any] = {"count": 6, "zones": 3, "lease_interval": 0.2,
                                "node_status_interval": 0.5, "start_delay": 0.05,
                                "heartbeat_tick": 0.0, "control_port": 0, **kw}

        def client() -> Client:
            return Client(ClientConfig(server="http://fleet.test", token=TOKEN),
                          transport=InProcessTransport(api))

        sim = Simulator(SimulatorConfig(**opts), ClientConfig(server="http://fleet.test", token=TOKEN),
                        client_factory=client)
        async with trio.open_nursery() as n:
            await n.start(sim.run)
            yield api, sim
            n.cancel_scope.cancel()


@pytest.fixture
async def sim_env(tmp_path: Any) -> AsyncIterator[tuple[InProcessAPI, Simulator]]:
    async with running_simulator(tmp_path) as env:
        yield env


async def test_simulator_registers_nodes_and_leases(sim_env: tuple[InProcessAPI, Simulator]) -> None:
    api, sim = sim_env
    assert sim.stats.nodes_registered == 6
    code, nodes = await api.json("GET", "/api/v1/nodes")
    assert code == 200
    by_name = {n["metadata"]["name"]: n for n in nodes["items"]}
    assert sorted(by_name) == sim.node_names == [f"sim-000{i}" for i in range(6)]
    zones = [by_name[n]["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in sim.node_names]
    assert zones == ["zone-a", "zone-b", "zone-c"] * 2
    code, leases = await api.json("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    assert {le["metadata"]["name"] for le in leases["items"]} == set(sim.node_names)
    lease = leases["items"][0]
    assert lease["metadata"]["ownerReferences"][0]["uid"] == by_name[lease["metadata"]["name"]]["metadata"]["uid"]

    async def renewed() -> bool:
        return sim.stats.lease_renewals >= 12 and sim.stats.node_status_updates >= 6
    await eventually(renewed)


async def test_bound_pods_run_and_deleted_pods_go(sim_env: tuple[InProcessAPI, Simulator]) -> None:
    api, sim = sim_env
    for i in range(3):
        assert (await api.json("POST", PODS, plain_pod(f"p{i}")))[0] == 201
        await bind(api, f"p{i}", "sim-0001")
    await api.json("POST", PODS, plain_pod("elsewhere"))
    await bind(api, "elsewhere", "real-node")  # not ours: left alone

    async def running() -> list[dict[str, Any]]:
        got = [(await api.json("GET", f"{PODS}/p{i}"))[1] for i in range(3)]
        return got if all(p["status"]["phase"] == "Running" for p in got) else []
    pods = await eventually(running)
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 3 and all(ip.startswith("100.64.1.") for ip in ips)
    assert all(p["status"]["hostIP"] == "198.18.0.2" for p in pods)
    assert all(p["status"]["containerStatuses"][0]["ready"] for p in pods)
    _, other = await api.json("GET", f"{PODS}/elsewhere")
    assert other["status"]["phase"] == "Pending"

    # A graceful delete only marks the pod; the simulated kubelet finishes it.
    code, marked = await api.json("DELETE", f"{PODS}/p0")
    assert code == 200 and marked["metadata"].get("deletionTimestamp")

    async def gone() -> bool:
        return (await api.json("GET", f"{PODS}/p0"))[0] == 404
    await eventually(gone)
    assert sim.stats.pods_deleted == 1

    async def forgotten() -> bool:
        return all(r.name != "p0" for r in sim.pods.values())
    await eventually(forgotten)
    # Its address is free again.
    assert len(sim.nodes["sim-0001"].blocks[fallback_pod_cidr(1)]) == 2


async def test_pod_asking_to_exit_finishes(sim_env: tuple[InProcessAPI, Simulator]) -> None:
    api, _ = sim_env
    body = plain_pod("job", annotations={EXIT_AFTER_ANNOTATION: "0.1", EXIT_CODE_ANNOTATION: "0"})
    body["spec"]["restartPolicy"] = "Never"
    await api.json("POST", PODS, body)
    await bind(api, "job", "sim-0002")

    async def done() -> bool:
        return (await api.json("GET", f"{PODS}/job"))[1]["status"]["phase"] == "Succeeded"
    await eventually(done)


async def test_paused_node_stops_renewing_alone(sim_env: tuple[InProcessAPI, Simulator]) -> None:
    api, sim = sim_env
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"

    async def renew_times() -> dict[str, str]:
        _, leases = await api.json("GET", lease_path)
        return {le["metadata"]["name"]: le["spec"]["renewTime"] for le in leases["items"]}

    code, body = sim.control("POST", "/nodes/sim-0003/pause")
    assert code == 200 and body["paused"] is True
    await trio.sleep(0.3)  # a renewal already in flight may still land
    before = await renew_times()
    await trio.sleep(0.8)
    after = await renew_times()
    assert after["sim-0003"] == before["sim-0003"]
    assert all(after[n] != before[n] for n in sim.node_names if n != "sim-0003")

    sim.resume_heartbeats("sim-0003")

    async def renewed() -> bool:
        return (await renew_times())["sim-0003"] != before["sim-0003"]
    await eventually(renewed)
    code, listing = sim.control("GET", "/nodes")
    assert code == 200 and not any(n["paused"] for n in listing["nodes"])
    assert sim.control("POST", "/nodes/nope/pause")[0] == 404


async def test_frozen_node_catches_up_on_resume(sim_env: tuple[InProcessAPI, Simulator]) -> None:
    api, sim = sim_env
    sim.pause_heartbeats("sim-0004", freeze_pods=True)
    await api.json("POST", PODS, plain_pod("late"))
    await bind(api, "late", "sim-0004")
    await trio.sleep(0.3)
    assert (await api.json("GET", f"{PODS}/late"))[1]["status"]["phase"] == "Pending"
    sim.resume_heartbeats("sim-0004")

    async def running() -> bool:
        return (await api.json("GET", f"{PODS}/late"))[1]["status"]["phase"] == "Running"
    await eventually(running)


async def test_control_endpoint_over_http(sim_env: tuple[InProcessAPI, Simulator]) -> None:
    _, sim = sim_env
    assert sim.control_url is not None
    async with httpx.AsyncClient(base_url=sim.control_url) as c:
        r = await c.post("/nodes/sim-0005/pause", params={"freezePods": "true"})
        assert r.status_code == 200 and r.json()["frozenPods"] is True
        r = await c.get("/stats")
        assert r.status_code == 200 and r.json()["nodes_registered"] == 6
        r = await c.post("/nodes/sim-0005/resume")
        assert r.json()["paused"] is False
        assert (await c.get("/nope")).status_code == 404
    assert not math.isnan(sim.stats.registration_seconds or 0.0)


async def test_pod_due_while_frozen_starts_on_resume(tmp_path: Any) -> None:
    async with running_simulator(tmp_path, start_delay=0.5) as (api, sim):
        await api.json("POST", PODS, plain_pod("waiting"))
        await bind(api, "waiting", "sim-0000")

        async def tracked() -> bool:
            return any(r.name == "waiting" for r in sim.pods.values())
        await eventually(tracked)
        sim.pause_heartbeats("sim-0000", freeze_pods=True)
        await trio.sleep(0.8)  # its start fell due meanwhile, and was skipped
        assert (await api.json("GET", f"{PODS}/waiting"))[1]["status"]["phase"] == "Pending"
        sim.resume_heartbeats("sim-0000")

        async def running() -> bool:
            return (await api.json("GET", f"{PODS}/waiting"))[1]["status"]["phase"] == "Running"
        await eventually(running)


# --------------------------------------------------------------------------- heartbeats, MockClock


class FakeAPI:
    """Just enough of the API for heartbeats, recording when each write arrived."""

    def __init__(self) -> None:
        self.renewals: dict[str, list[float]] = {}
        self.statuses: dict[str, list[float]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        now = trio.current_time()
        name = path.rstrip("/").split("/")[-1]
        if method == "POST":
            body = json.loads(request.content)
            body.setdefault("metadata", {})["uid"] = "u-" + body["metadata"]["name"]
            return httpx.Response(201, json=body)
        if method == "PATCH" and "/leases/" in path:
            self.renewals.setdefault(name, []).append(now)
            return httpx.Response(200, json={})
        if method == "PATCH" and path.endswith("/status"):
            node = path.split("/")[-2]
            self.statuses.setdefault(node, []).append(now)
            return httpx.Response(200, json={"metadata": {"name": node}, "spec": {}})
        if method == "GET" and "watch" in request.url.params:
            return httpx.Response(200, content=b"")  # an empty stream; the client re-watches
        if method == "GET" and "/nodes/" in path:
            return httpx.Response(200, json={"metadata": {"name": name}, "spec": {}})
        if method == "GET" and path.endswith("/pods"):
            return httpx.Response(200, json={"items": [], "metadata": {"resourceVersion": "1"}})
        return httpx.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})


@pytest.mark.parametrize("tick", [0.0, 0.25])
async def test_heartbeats_keep_their_phase_and_pause_alone(
        autojump_clock: trio.testing.MockClock, tick: float) -> None:
    fake = FakeAPI()
    cfg = SimulatorConfig(count=10, lease_interval=10.0, node_status_interval=60.0,
                          heartbeat_tick=tick)
    sim = Simulator(cfg, ClientConfig(server="http://fake", token="t"),
                    client_factory=lambda: Client(ClientConfig(server="http://fake", token="t"),
                                                  transport=httpx.MockTransport(fake)))
    async with trio.open_nursery() as n:
        await n.start(sim.run)
        t0 = sim._origin
        await trio.sleep_until(t0 + 45)
        sim.pause_heartbeats("sim-0003")
        await trio.sleep_until(t0 + 70.5)
        sim.resume_heartbeats("sim-0003")
        await trio.sleep_until(t0 + 130.5)
        n.cancel_scope.cancel()

    for i, name in enumerate(sim.node_names):
        times = [t - t0 for t in fake.renewals[name]]
        if name == "sim-0003":
            # Slots 3, 13, 23, 33, 43; silent while paused; at once on resume, then the
            # node's own slots again (73 is too close to the resume, so 83 ...).
            assert times[:5] == pytest.approx([3, 13, 23, 33, 43], abs=tick + 1e-6)
            assert not [t for t in times if 45 < t < 70.5]
            assert times[5] == pytest.approx(70.5, abs=1e-6)
            assert times[6:] == pytest.approx([73, 83, 93, 103, 113, 123], abs=tick + 1e-6)
            continue
        # Node i renews at i, i + 10, ... (registered at 0 with its Lease fresh,
        # so node 0 waits for 10).
        assert times == pytest.approx([i + 10.0 * k for k in range(14) if 0 < i + 10 * k < 130.5],
                                      abs=tick + 1e-6)
        # Status heartbeats: every 60 s at the node's own phase (6 s apart per node).
        assert [t - t0 for t in fake.statuses[name]] == pytest.approx(
            [6.0 * i + 60 * k for k in range(3) if 0 < 6.0 * i + 60 * k < 130.5], abs=tick + 1e-6)
    # The paused node wrote its status with the resume (a change is written at once).
    assert any(abs(t - t0 - 70.5) < 1e-6 for t in fake.statuses["sim-0003"])


class SlowAPI(httpx.AsyncBaseTransport):
    """FakeAPI behind a fixed latency, counting pod status writes in flight."""

    def __init__(self, latency: float) -> None:
        self.fake = FakeAPI()
        self.latency = latency
        self.pod_writes = 0
        self.in_flight = 0
        self.max_in_flight_while_behind = 0
        self.sim: Simulator | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pod_write = "/pods/" in request.url.path and request.method == "PATCH"
        if pod_write:
            self.in_flight += 1
            if self.sim is not None and self.sim.heartbeats_behind():
                self.max_in_flight_while_behind = max(self.max_in_flight_while_behind,
                                                      self.in_flight)
        try:
            await trio.sleep(self.latency)
            if pod_write:
                self.pod_writes += 1
                return httpx.Response(200, json={})
            await request.aread()
            return self.fake(request)
        finally:
            if pod_write:
                self.in_flight -= 1


async def test_pod_work_makes_way_for_late_heartbeats(autojump_clock: trio.testing.MockClock) -> None:
    # One lease worker at 0.2 s a request carries 5 renewals/s; 20 nodes at 1 s need 20.
    slow = SlowAPI(latency=0.2)
    cfg = SimulatorConfig(count=20, lease_interval=1.0, lease_concurrency=1, pod_concurrency=8,
                          start_delay=0.0, heartbeat_tick=0.0)
    sim = Simulator(cfg, ClientConfig(server="http://fake", token="t"),
                    client_factory=lambda: Client(ClientConfig(server="http://fake", token="t"),
                                                  transport=slow))
    slow.sim = sim
    async with trio.open_nursery() as n:
        await n.start(sim.run)
        await trio.sleep(5)  # renewals fall behind
        assert sim.heartbeats_behind()
        for i in range(40):
            sim.on_pod_event("ADDED", pod(f"p{i}", node=sim.node_names[i % 20]) | {
                "metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"}})
        await trio.sleep(20)
        n.cancel_scope.cancel()
    assert sim.stats.pod_work_deferred > 0
    assert slow.max_in_flight_while_behind == 1  # only the one worker that always runs
    assert slow.pod_writes == sim.stats.pods_started == 40  # and it got everything done
