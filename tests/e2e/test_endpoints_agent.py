"""Service endpoints with real containers: `fleet server` with its built-in agent (runc,
bridge networking), kubectl driving.

* A Deployment of busybox httpd (a named container port `http`, readiness by httpGet)
  behind a Service whose `targetPort` is that name: once the probes pass, the slice
  and the Endpoints list the pods' addresses on port 8080, and each listed address
  answers HTTP there (from the host, on the test's own bridge).
* A pod whose readiness probe fails is in the slice with ready/serving false and in
  the Endpoints' `notReadyAddresses`.
* A pod deleted while its container ignores SIGTERM (terminationGracePeriodSeconds 6)
  is `terminating` — ready false, serving true — in its slice for as long as the agent
  is stopping it, out of the Endpoints at once, and out of the slice once it is gone;
  the Deployment's replacement takes its place.

The bridge (`fe-br0`), its nftables table and the pod addresses (10.219.0.0/16) are
this module's own; everything is removed at the end, a leak fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import (
    KUBECTL,
    FleetServer,
    create_namespace,
    run_kubectl,
)
from tests.e2e.agentcluster import agent_cluster
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent import IMAGE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runc, bridge networking)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl"),
]

BRIDGE = "fe-br0"
CLUSTER_CIDR = "10.219.0.0/16"


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    with agent_cluster(request, tmp_path_factory.mktemp("fe-endpoints-agent"), bridge=BRIDGE,
                       cluster_cidr=CLUSTER_CIDR, delete_pods=True, grace=0) as srv:
        yield srv


@pytest.fixture
def ns(cluster: FleetServer) -> str:
    name = f"fe-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, name)
    return name


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=120)
    assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


SERVE = ("trap '' TERM; mkdir -p /www; echo ok > /www/ok; httpd -p 8080 -h /www; "
         "while true; do sleep 1; done")


def container(probe: dict[str, Any]) -> dict[str, Any]:
    return {"name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", SERVE],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {**probe, "periodSeconds": 1, "timeoutSeconds": 5}}


HTTP_PROBE = {"httpGet": {"path": "/ok", "port": "http"}}


def slice_endpoints(srv: FleetServer, ns: str) -> dict[str, dict[str, Any]]:
    out = kubectl(srv, "-n", ns, "get", "endpointslices", "-l", "kubernetes.io/service-name=fe-web", "-o", "json")
    return {e["targetRef"]["name"]: e for s in json.loads(out)["items"] for e in s.get("endpoints") or []}


def endpoints(srv: FleetServer, ns: str) -> dict[str, Any]:
    return json.loads(kubectl(srv, "-n", ns, "get", "endpoints", "fe-web", "-o", "json"))


def ips(ep: dict[str, Any], field: str) -> set[str]:
    return {a["ip"] for ss in ep.get("subsets") or [] for a in ss.get(field) or []}


def web_pods(srv: FleetServer, ns: str) -> dict[str, dict[str, Any]]:
    out = kubectl(srv, "-n", ns, "get", "pods", "-l", "app=fe-web", "-o", "json")
    return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}


def test_endpoints_follow_real_pods(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "fe-web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "fe-web"}},
                 "template": {"metadata": {"labels": {"app": "fe-web", "role": "web"}},
                              "spec": {"terminationGracePeriodSeconds": 6,
                                       "containers": [container(HTTP_PROBE)]}}}}))
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fe-never-ready", "labels": {"app": "fe-web"}},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [container({"exec": {"command": ["false"]}})]}}))
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "fe-web"},
        "spec": {"selector": {"app": "fe-web"}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}}))

    def two_ready() -> dict[str, dict[str, Any]] | None:
        eps = slice_endpoints(srv, ns)
        ready = {n: e for n, e in eps.items() if e["conditions"]["ready"]}
        return eps if len(ready) == 2 and "fe-never-ready" in eps else None
    eps = wait_until(two_ready, timeout=120, what="2 ready endpoints and the never-ready pod")
    assert eps["fe-never-ready"]["conditions"] == {"ready": False, "serving": False, "terminating": False}
    pods = web_pods(srv, ns)
    ready_ips = {e["addresses"][0] for n, e in eps.items() if e["conditions"]["ready"]}
    assert ready_ips == {p["status"]["podIP"] for n, p in pods.items() if n != "fe-never-ready"}
    def ready_in_endpoints() -> dict[str, Any] | None:
        ep = endpoints(srv, ns)
        return ep if ips(ep, "addresses") == ready_ips else None
    ep = wait_until(ready_in_endpoints, timeout=30, what="the Endpoints' ready addresses")
    assert ips(ep, "notReadyAddresses") == {pods["fe-never-ready"]["status"]["podIP"]}
    assert ep["subsets"][0]["ports"] == [{"name": "web", "port": 8080, "protocol": "TCP"}]
    # What the endpoints say is true: each ready address serves on the resolved port.
    for ip in ready_ips:
        with urllib.request.urlopen(f"http://{ip}:8080/ok", timeout=10) as r:  # the test's own bridge
            assert r.read().strip() == b"ok"

    # Delete one web pod: its container ignores SIGTERM, so it stays terminating ~6 s.
    victim = sorted(n for n in pods if n != "fe-never-ready")[0]
    victim_ip = pods[victim]["status"]["podIP"]
    kubectl(srv, "-n", ns, "delete", "pod", victim, "--wait=false")
    term = wait_until(lambda: (e := slice_endpoints(srv, ns).get(victim)) and e["conditions"]["terminating"] and e,
                      timeout=30, what="the deleted pod terminating in its slice")
    assert term["conditions"] == {"ready": False, "serving": True, "terminating": True}
    assert victim in web_pods(srv, ns)  # still there: the agent is stopping it
    assert victim_ip not in ips(endpoints(srv, ns), "addresses") | ips(endpoints(srv, ns), "notReadyAddresses")
    started = time.monotonic()
    wait_until(lambda: victim not in slice_endpoints(srv, ns), timeout=60, what="the deleted pod out of the slice")
    assert victim not in web_pods(srv, ns) and time.monotonic() - started < 60

    def replaced() -> bool:
        eps = slice_endpoints(srv, ns)
        return sum(1 for e in eps.values() if e["conditions"]["ready"]) == 2 and victim not in eps
    wait_until(replaced, timeout=120, what="the replacement pod ready in the slice")
