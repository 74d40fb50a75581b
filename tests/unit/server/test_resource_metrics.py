"""The resource metrics API: parsing the agents' answers, rates between scrapes (pure,
table-driven), and serving metrics.k8s.io through the in-process API with a fake agent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from fleet.agent.api import LocatedContainer, resource_metrics
from fleet.api.kinds.metrics import SIMULATE_CPU_ANNOTATION, SIMULATE_MEMORY_ANNOTATION
from fleet.runtime.driver import ContainerStats
from fleet.server.metrics_scraper import (
    ContainerSample,
    NodeScrape,
    Usage,
    parse_prometheus,
    parse_resource_metrics,
    usage_between,
)
from fleet.testing.apiserver import open_api

# ---------------------------------------------------------------------------------------
# Parsing


def test_parse_prometheus():
    text = "\n".join([
        "# HELP x y", "# TYPE node_cpu_usage_seconds_total counter",
        "node_cpu_usage_seconds_total 12.5 1700000000123",
        'container_cpu_usage_seconds_total{container="c",namespace="ns",pod="p"} 0.25 17',
        r'weird{a="x\"y",b="back\\slash",c="line\nbreak"} 1e3',
        "garbage line", "nan_metric NaN", "",
    ])
    assert parse_prometheus(text) == [
        ("node_cpu_usage_seconds_total", {}, 12.5, 1700000000123),
        ("container_cpu_usage_seconds_total", {"container": "c", "namespace": "ns", "pod": "p"},
         0.25, 17),
        ("weird", {"a": 'x"y', "b": "back\\slash", "c": "line\nbreak"}, 1000.0, None),
    ]


def test_parse_resource_metrics():
    text = "\n".join([
        "node_cpu_usage_seconds_total 100.5 2000",
        "node_memory_working_set_bytes 1e9 2000",
        'container_cpu_usage_seconds_total{container="c",namespace="ns",pod="p"} 3.5 1990',
        'container_memory_working_set_bytes{container="c",namespace="ns",pod="p"} 4096 1990',
        'container_start_time_seconds{container="c",namespace="ns",pod="p"} 1.5e9 1990',
        'container_cpu_usage_seconds_total{container="",namespace="ns",pod="p"} 1 1990',
        "scrape_error 0",
    ])
    s = parse_resource_metrics(text, received_ms=5000)
    assert (s.ts_ms, s.cpu_seconds, s.memory_bytes) == (2000, 100.5, 1e9)
    assert s.containers == {("ns", "p", "c"): ContainerSample(1990, 3.5, 4096.0, 1.5e9)}
    assert parse_resource_metrics("", received_ms=7).ts_ms == 7


# ---------------------------------------------------------------------------------------
# Rates


def scrape(ts: int, cpu: float | None = 0.0, mem: float | None = 1000.0,
           **containers: tuple[float | None, float | None, float]) -> NodeScrape:
    """containers: "pod.container" -> (cpu seconds, memory, start time)."""
    out = NodeScrape(ts, cpu, mem)
    for key, (c, m, start) in containers.items():
        pod, _, name = key.partition("_")
        out.containers[("ns", pod, name)] = ContainerSample(ts, c, m, start)
    return out


@pytest.mark.parametrize(("case", "prev", "cur", "node", "pods"), [
    ("first scrape: no rate yet", None, scrape(1000, 5), None, {}),
    ("node rate and window", scrape(1000, 10.0), scrape(3000, 11.0),
     Usage(500_000_000, 1000, 3000, 2.0), {}),
    ("node counter went backwards", scrape(1000, 10.0), scrape(3000, 1.0), None, {}),
    ("no memory, no node metrics", scrape(1000, 10.0), scrape(3000, 11.0, None), None, {}),
    ("pod with one container", scrape(1000, web_app=(1.0, 10, 5)),
     scrape(2000, web_app=(1.25, 20, 5)), Usage(0, 1000, 2000, 1.0),
     {("ns", "web"): ((("app", 250_000_000, 20),), 2000, 1.0)}),
    ("restarted container starts a new series", scrape(1000, web_app=(9.0, 10, 5)),
     scrape(2000, web_app=(0.1, 20, 6)), Usage(0, 1000, 2000, 1.0), {}),
    ("a pod is reported only whole", scrape(1000, web_app=(1.0, 10, 5)),
     scrape(2000, web_app=(2.0, 20, 5), web_side=(0.5, 1, 7)), Usage(0, 1000, 2000, 1.0), {}),
    ("containers sorted, pod keys per pod",
     scrape(1000, a_z=(1.0, 1, 1), a_y=(1.0, 1, 1), b_x=(0.0, 1, 1)),
     scrape(1500, a_z=(1.5, 2, 1), a_y=(1.0, 3, 1), b_x=(0.1, 4, 1)), Usage(0, 1000, 1500, 0.5),
     {("ns", "a"): ((("y", 0, 3), ("z", 1_000_000_000, 2)), 1500, 0.5),
      ("ns", "b"): ((("x", 200_000_000, 4),), 1500, 0.5)}),
])
def test_usage_between(case, prev, cur, node, pods):
    got_node, got_pods = usage_between("n1", prev, cur)
    assert got_node == node, case
    assert {k: (v.containers, v.ts_ms, v.window) for k, v in got_pods.items()} == pods, case
    assert all(v.node == "n1" for v in got_pods.values())


# ---------------------------------------------------------------------------------------
# The agent's endpoint


class FakeDriver:
    def __init__(self, cpu_ns: int, ws: int) -> None:
        self.cpu_ns, self.ws = cpu_ns, ws

    async def stats(self, handle: Any) -> ContainerStats:
        from datetime import UTC, datetime

        return ContainerStats(datetime.fromtimestamp(1_800_000_000.5, UTC), self.cpu_ns, None,
                              self.ws, 1)


class FakeHandle:
    from datetime import UTC, datetime
    started_at = datetime.fromtimestamp(1_799_999_000, UTC)


class FakeLocator:
    def find(self, namespace: str, pod: str, container: str | None) -> None:
        return None

    def all(self) -> list[Any]:
        return [("ns", 'we"b', "uid", [
            ("app", LocatedContainer(driver=FakeDriver(2_500_000_000, 4096),  # type: ignore[arg-type]
                                     handle=FakeHandle())),  # type: ignore[arg-type]
            ("waiting", LocatedContainer(driver=FakeDriver(0, 0), handle=None)),  # type: ignore[arg-type]
        ])]


async def test_agent_endpoint_round_trips_through_the_parser():
    text = await resource_metrics(FakeLocator())  # type: ignore[arg-type]
    s = parse_resource_metrics(text, received_ms=0)
    assert s.cpu_seconds is not None and s.cpu_seconds > 0 and s.memory_bytes
    assert s.containers == {("ns", 'we"b', "app"): ContainerSample(
        1_800_000_000_500, 2.5, 4096.0, 1_799_999_000.0)}


# ---------------------------------------------------------------------------------------
# Serving metrics.k8s.io


def node(name: str, *, simulated: bool = False, port: int = 10250) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "role": "sim" if simulated else "real"}
    if simulated:
        labels["fleet.dev/simulated"] = "true"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels,
                                                              "annotations": {"fleet.dev/agent-api-scheme": "http"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                       "allocatable": {"cpu": "4", "memory": "8Gi"}}}


def pod(name: str, node_name: str, *, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": labels or {"app": "web"}}
    if annotations:
        md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"nodeName": node_name,
                     "containers": [{"name": "app", "image": "busybox"},
                                    {"name": "side", "image": "busybox"}]}}


class FakeAgent:
    """What `/metrics/resource` of node `real` answers: counters that grow by 0.5 cpu-s per
    second of agent time for pod `web`, and 1 cpu-s per second for the node."""

    def __init__(self) -> None:
        self.t_ms = 1_800_000_000_000
        self.auth: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.url.host == "10.9.9.9" and request.url.path == "/metrics/resource"
        self.auth.append(request.headers.get("authorization", ""))
        t = self.t_ms / 1000 - 1_800_000_000
        lines = [f"node_cpu_usage_seconds_total {100 + t} {self.t_ms}",
                 f"node_memory_working_set_bytes {2 * 1024**3} {self.t_ms}"]
        for c, rate in (("app", 0.4), ("side", 0.1)):
            lab = f'container="{c}",namespace="default",pod="web"'
            lines += [f"container_cpu_usage_seconds_total{{{lab}}} {rate * t} {self.t_ms}",
                      f"container_memory_working_set_bytes{{{lab}}} {1024**2} {self.t_ms}",
                      f"container_start_time_seconds{{{lab}}} 1700000000 {self.t_ms}"]
        return httpx.Response(200, text="\n".join(lines) + "\n")


async def call(api: Any, path: str, **kw: Any) -> tuple[int, Any]:
    return await api.json("GET", path, **kw)


async def test_metrics_api_end_to_end_in_process(tmp_path):
    agent = FakeAgent()
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        rm = api.server.resource_metrics
        rm.token, rm.resolution = "agent-token", 15.0
        for n in (node("real"), node("sim-0", simulated=True), node("sim-1", simulated=True)):
            assert (await api.json("POST", "/api/v1/nodes", n))[0] == 201
        busy = {SIMULATE_CPU_ANNOTATION: "300m", SIMULATE_MEMORY_ANNOTATION: "64Mi"}
        for ns, p in (("default", pod("web", "real")),
                      ("default", pod("busy", "sim-0", annotations=busy)),
                      ("default", pod("idle", "sim-0", labels={"app": "other"})),
                      ("kube-system", pod("busy2", "sim-1", annotations=busy))):
            name = p["metadata"]["name"]
            assert (await api.json("POST", f"/api/v1/namespaces/{ns}/pods", p))[0] == 201
            code, _ = await api.json("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                                     {"status": {"phase": "Running"}},
                                     content_type="application/merge-patch+json")
            assert code == 200
        await nursery.start(rm._watch_nodes)
        async with httpx.AsyncClient(transport=httpx.MockTransport(agent.handler)) as http:
            await rm.scrape_all(http)
            # One scrape is no rate: the real node and its pod have no metrics yet.
            code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/nodes")
            assert code == 200 and body["kind"] == "NodeMetricsList"
            assert [i["metadata"]["name"] for i in body["items"]] == ["sim-0", "sim-1"]
            agent.t_ms += 2000
            await rm.scrape_all(http)
        assert agent.auth == ["Bearer agent-token"] * 2

        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/nodes")
        by_name = {i["metadata"]["name"]: i for i in body["items"]}
        assert by_name["real"]["usage"] == {"cpu": "1", "memory": "2Gi"}
        assert by_name["real"]["window"] == "2s"
        assert by_name["real"]["timestamp"] == "2027-01-15T08:00:02Z"
        assert by_name["real"]["metadata"]["labels"]["role"] == "real"
        # A simulated node is the sum of its running pods' declared usage.
        assert by_name["sim-0"]["usage"] == {"cpu": "300m", "memory": "64Mi"}
        assert by_name["sim-0"]["window"] == "15s"

        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/nodes",
                                query={"labelSelector": "role=sim"})
        assert sorted(i["metadata"]["name"] for i in body["items"]) == ["sim-0", "sim-1"]
        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/nodes/real")
        assert code == 200 and body["kind"] == "NodeMetrics"

        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")
        assert code == 200 and body["kind"] == "PodMetricsList"
        pods = {i["metadata"]["name"]: i for i in body["items"]}
        assert sorted(pods) == ["busy", "idle", "web"]
        assert pods["web"]["containers"] == [
            {"name": "app", "usage": {"cpu": "400m", "memory": "1Mi"}},
            {"name": "side", "usage": {"cpu": "100m", "memory": "1Mi"}}]
        assert pods["web"]["metadata"]["labels"] == {"app": "web"}
        assert pods["busy"]["containers"] == [
            {"name": "app", "usage": {"cpu": "150m", "memory": "32Mi"}},
            {"name": "side", "usage": {"cpu": "150m", "memory": "32Mi"}}]
        assert pods["idle"]["containers"][0]["usage"] == {"cpu": "0", "memory": "0"}

        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/pods",
                                query={"labelSelector": "app=web"})
        assert sorted((i["metadata"]["namespace"], i["metadata"]["name"])
                      for i in body["items"]) == [("default", "busy"), ("default", "web"),
                                                  ("kube-system", "busy2")]
        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/pods",
                                query={"fieldSelector": "metadata.namespace=kube-system"})
        assert [i["metadata"]["name"] for i in body["items"]] == ["busy2"]
        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web")
        assert code == 200 and body["kind"] == "PodMetrics" and body["window"] == "2s"

        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope")
        assert code == 404 and body["message"] == 'pods.metrics.k8s.io "nope" not found'
        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/nodes/nope")
        assert code == 404 and body["message"] == 'nodes.metrics.k8s.io "nope" not found'

        resp = await api.call("GET", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods",
                              headers={"accept": "application/json;as=Table;v=v1;"
                                                 "g=meta.k8s.io"})
        table = json.loads(resp.body)
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "CPU", "Memory",
                                                                    "Window"]
        assert ["web", "500m", "2Mi", "2s"] in [r["cells"] for r in table["rows"]]

        # Read-only: no watch, no writes.
        code, _ = await call(api, "/apis/metrics.k8s.io/v1beta1/pods", query={"watch": "1"})
        assert code == 405
        code, _ = await api.json("DELETE", "/apis/metrics.k8s.io/v1beta1/nodes/real")
        assert code == 405

        # The agent goes away: its node and pods lose their metrics at once.
        async with httpx.AsyncClient(transport=httpx.MockTransport(
                lambda r: httpx.Response(503, text="down"))) as http:
            await rm.scrape_all(http)
        code, body = await call(api, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")
        assert sorted(i["metadata"]["name"] for i in body["items"]) == ["busy", "idle"]
        # Deleting a node removes it (the watch keeps the node list).
        assert (await api.json("DELETE", "/api/v1/nodes/sim-1"))[0] == 200
        with trio.fail_after(5):
            while "sim-1" in rm.nodes:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_discovery_lists_the_groups_both_ways(tmp_path):
    async with open_api(tmp_path) as api:
        code, groups = await call(api, "/apis")
        names = {g["name"]: g for g in groups["groups"]}
        assert names["metrics.k8s.io"]["preferredVersion"]["groupVersion"] == \
            "metrics.k8s.io/v1beta1"
        assert names["autoscaling"]["preferredVersion"]["version"] == "v2"
        code, res = await call(api, "/apis/metrics.k8s.io/v1beta1")
        assert {(r["name"], r["kind"], r["namespaced"], tuple(r["verbs"]))
                for r in res["resources"]} == {("nodes", "NodeMetrics", False, ("get", "list")),
                                               ("pods", "PodMetrics", True, ("get", "list"))}
        resp = await api.call("GET", "/apis", headers={
            "accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"})
        doc = json.loads(resp.body)
        groups = {i["metadata"]["name"]: i for i in doc["items"]}
        metrics = groups["metrics.k8s.io"]["versions"][0]
        assert metrics["version"] == "v1beta1"
        assert sorted(r["resource"] for r in metrics["resources"]) == ["nodes", "pods"]
        hpa = groups["autoscaling"]["versions"][0]["resources"][0]
        assert (hpa["resource"], hpa["shortNames"]) == ("horizontalpodautoscalers", ["hpa"])
