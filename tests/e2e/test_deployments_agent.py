"""Rolling updates with real containers: `fleet server` with its built-in agent (runc,
bridge networking), kubectl driving, a client watching readiness the whole time.

* A 3-replica HTTP Deployment (busybox httpd serving a version file, readiness by
  httpGet) goes from v1 to v2 with maxUnavailable 0 while a client lists the pods
  every ~50 ms and counts the Ready ones that are not terminating, and another
  follows the pod watch and counts after every single event: neither may ever see
  fewer than 3.  `kubectl rollout status` returns when the rollout is done, every pod
  then answers "v2" on its own IP; `kubectl rollout undo` brings "v1" back under the
  same watch; `kubectl rollout history` lists the revisions.
* An image that cannot be pulled stalls the next rollout: the old pods keep serving
  (maxUnavailable 25% of 3 rounds down to 0) and `kubectl rollout status` reports the
  progress deadline exceeded.

The busybox image is imported into the built-in agent's image store before the
server starts, so nothing is pulled from a registry.  The bridge and the pod
addresses are this module's own (`fleetdep0`, 10.245.0.0/16).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
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

BRIDGE = "fleetdep0"
CLUSTER_CIDR = "10.245.0.0/16"
APPS = "/apis/apps/v1"


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    with agent_cluster(request, tmp_path_factory.mktemp("deploy-agent"), bridge=BRIDGE,
                       cluster_cidr=CLUSTER_CIDR) as srv:
        yield srv


@pytest.fixture
def ns(cluster: FleetServer) -> str:
    name = f"roll-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, name)
    return name


def kubectl(srv: FleetServer, *args: str, input: str | None = None, timeout: float = 180,
            ok: bool = True) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=timeout)
    if ok:
        assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
        return out
    assert rc != 0, f"kubectl {' '.join(args)} should have failed\n{out}"
    return out + err


def web_deployment(ns: str, version: str, *, strategy: dict[str, Any] | None = None,
                   pds: int = 600) -> str:
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 3, "progressDeadlineSeconds": pds,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": strategy or {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                        "env": [{"name": "VERSION", "value": version}],
                        "command": ["sh", "-c", "mkdir -p /www; echo $VERSION > /www/version; "
                                                "exec httpd -f -p 8080 -h /www"],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/version", "port": 8080},
                                           "periodSeconds": 1, "timeoutSeconds": 5},
                    }],
                },
            },
        },
    })


def pods(srv: FleetServer, ns: str, c: httpx.Client | None = None) -> list[dict[str, Any]]:
    if c is None:
        with srv.client() as cc:
            return pods(srv, ns, cc)
    r = c.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": "app=web"})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def serving(p: dict[str, Any]) -> bool:
    """Ready and not terminating: what a Service would send traffic to."""
    return not p["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))


class ReadinessWatch:
    """Two threads counting the serving pods while a rollout runs:

    * a poller listing the pods about every 50 ms (what the issue asks for);
    * a watcher applying every pod event in order and counting after each one — the
      count at every revision of the namespace's pods, not just at sampled moments.

    Both keep the fewest serving pods they saw."""

    def __init__(self, srv: FleetServer, ns: str) -> None:
        self.srv, self.ns = srv, ns
        self.min_serving: int | None = None  # the poller's
        self.min_watched: int | None = None  # the watcher's, over every event
        self.polls = 0
        self.events = 0
        self.max_gap = 0.0
        self.low: list[tuple[str, list[str]]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, daemon=True),
                         threading.Thread(target=self._watch, daemon=True)]
        self._watching = threading.Event()

    def _poll(self) -> None:
        with self.srv.client(timeout=10) as c:
            last = time.monotonic()
            while not self._stop.is_set():
                ps = pods(self.srv, self.ns, c)
                n = sum(1 for p in ps if serving(p))
                now = time.monotonic()
                self.max_gap = max(self.max_gap, now - last)
                last = now
                self.polls += 1
                if self.min_serving is None or n < self.min_serving:
                    self.min_serving = n
                if n < 3:
                    self.low.append(("poll", [f"{p['metadata']['name']}:{serving(p)}" for p in ps]))
                self._stop.wait(0.05)

    def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.ns}/pods"
        with self.srv.client(timeout=30) as c:
            listed = c.get(path, params={"labelSelector": "app=web"}).json()
            state = {p["metadata"]["name"]: p for p in listed["items"]}
            rv = listed["metadata"]["resourceVersion"]
            self.min_watched = sum(1 for p in state.values() if serving(p))
            self._watching.set()
            while not self._stop.is_set():
                params = {"watch": "1", "resourceVersion": rv, "labelSelector": "app=web",
                          "timeoutSeconds": "1", "allowWatchBookmarks": "true"}
                with c.stream("GET", path, params=params) as r:
                    for line in r.iter_lines():
                        if not line:
                            continue
                        ev = json.loads(line)
                        obj = ev["object"]
                        assert ev["type"] != "ERROR", ev
                        rv = obj["metadata"]["resourceVersion"]
                        if ev["type"] == "BOOKMARK":
                            continue
                        if ev["type"] == "DELETED":
                            state.pop(obj["metadata"]["name"], None)
                        else:
                            state[obj["metadata"]["name"]] = obj
                        self.events += 1
                        n = sum(1 for p in state.values() if serving(p))
                        self.min_watched = min(self.min_watched, n)
                        if n < 3:
                            self.low.append((f"event@{rv}", sorted(
                                f"{k}:{serving(p)}" for k, p in state.items())))

    def __enter__(self) -> ReadinessWatch:
        for t in self._threads:
            t.start()
        assert self._watching.wait(30), "the watch did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def check(self, what: str) -> None:
        print(f"{what}: {self.polls} polls (longest gap {self.max_gap * 1000:.0f} ms), "
              f"{self.events} pod events watched")
        assert self.polls > 10 and self.events > 0
        assert self.min_serving is not None and self.min_serving >= 3, self.low[:5]
        assert self.min_watched is not None and self.min_watched >= 3, self.low[:5]


def versions(srv: FleetServer, ns: str) -> set[str]:
    """What every serving pod answers on its own IP."""
    out = set()
    for p in pods(srv, ns):
        if serving(p):
            r = httpx.get(f"http://{p['status']['podIP']}:8080/version", timeout=10)
            out.add(r.text.strip())
    return out


def test_rolling_update_never_drops_below_three_ready(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    kubectl(srv, "apply", "-f", "-", input=web_deployment(ns, "v1"))
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
    assert versions(srv, ns) == {"v1"}

    with ReadinessWatch(srv, ns) as watch:
        kubectl(srv, "-n", ns, "set", "env", "deployment/web", "VERSION=v2")
        out = kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=240s")
    assert 'deployment "web" successfully rolled out' in out
    watch.check("v1 -> v2")
    d = json.loads(kubectl(srv, "-n", ns, "get", "deployment/web", "-o", "json"))
    st = d["status"]
    assert (st["updatedReplicas"], st["readyReplicas"], st["availableReplicas"]) == (3, 3, 3)
    assert st["replicas"] == 3 and st["observedGeneration"] == d["metadata"]["generation"]
    assert versions(srv, ns) == {"v2"}
    assert len([p for p in pods(srv, ns) if serving(p)]) == 3

    with ReadinessWatch(srv, ns) as watch:
        assert "rolled back" in kubectl(srv, "-n", ns, "rollout", "undo", "deployment/web")
        kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=240s")
    watch.check("undo")
    assert versions(srv, ns) == {"v1"}

    history = kubectl(srv, "-n", ns, "rollout", "history", "deployment/web")
    assert [ln.split()[0] for ln in history.splitlines()[2:] if ln.strip()] == ["2", "3"], history
    rses = json.loads(kubectl(srv, "-n", ns, "get", "rs", "-o", "json"))["items"]
    assert sorted((rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
                   rs["spec"]["replicas"]) for rs in rses) == [("2", 0), ("3", 3)]


def test_unpullable_image_stalls_without_losing_old_replicas(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    default = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    kubectl(srv, "apply", "-f", "-", input=web_deployment(ns, "v1", strategy=default, pds=15))
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
    with ReadinessWatch(srv, ns) as watch:
        kubectl(srv, "-n", ns, "set", "image", "deployment/web", "web=127.0.0.1:1/nope/nope:1")
        out = kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s", ok=False)
    assert 'deployment "web" exceeded its progress deadline' in out, out
    watch.check("stalled rollout")
    ps = pods(srv, ns)
    stuck = [p for p in ps if p["spec"]["containers"][0]["image"].startswith("127.0.0.1:1/")]
    assert len(stuck) == 1, [p["metadata"]["name"] for p in ps]  # surge 1, nothing more
    waiting = (stuck[0]["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
    assert waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"), stuck[0]["status"]
    assert sum(1 for p in ps if serving(p)) == 3
    d = json.loads(kubectl(srv, "-n", ns, "get", "deployment/web", "-o", "json"))
    conds = {c["type"]: c for c in d["status"]["conditions"]}
    assert conds["Progressing"]["reason"] == "ProgressDeadlineExceeded"
    assert conds["Available"]["status"] == "True"
    # Undo: back to the working template, the stuck pod goes.
    kubectl(srv, "-n", ns, "rollout", "undo", "deployment/web")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
    wait_until(lambda: all(p["spec"]["containers"][0]["image"] == IMAGE for p in pods(srv, ns)),
               timeout=60, what="the stuck pod to go")
