"""kubectl cordon / drain / uncordon on a cluster of one real agent and simulated nodes.

A `fleet server` with a separate real `fleet agent` (runc; busybox imported) and 4
simulated nodes (in-process simulator).  Pods of a "workload" are spread over all
five nodes.  Then, with real kubectl:

- `kubectl cordon` the real node: nothing new lands there;
- `kubectl drain --ignore-daemonsets --delete-emptydir-data --force` it: its pods are
  evicted through `pods/eviction`, the real agent stops their containers gracefully,
  and the node keeps nothing; pods elsewhere are untouched;
- the same for a simulated node;
- `kubectl uncordon` makes both schedulable again and new pods land there.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import KUBECTL, FleetServer, create_namespace, run_kubectl
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent import IMAGE, get
from tests.e2e.test_pod_lifecycle import Agent, running_cluster
from tests.integration.test_scheduling_sim import SimThread

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the real agent runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl"),
]


def kubectl(srv: FleetServer, *args: str) -> str:
    rc, out, err = run_kubectl(srv, *args, timeout=120)
    assert rc == 0, f"kubectl {' '.join(args)}: rc={rc}\n{out}\n{err}"
    return out + err


def web(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"],
                                     "resources": {"requests": {"cpu": "10m"}}}]}}


def pods(srv: FleetServer, ns: str) -> list[dict[str, Any]]:
    return get(srv, f"/api/v1/namespaces/{ns}/pods")[1]["items"]


def on_node(srv: FleetServer, ns: str, node: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods(srv, ns) if p["spec"].get("nodeName") == node)


def test_cordon_drain_uncordon_real_and_simulated(request: pytest.FixtureRequest) -> None:
    module = request.node.getparent(pytest.Module)
    with running_cluster("oci", lambda: getattr(module, "_fleet_failed", False)) as (srv, agent):
        sim = SimThread(srv, count=4, prefix=f"dr{uuid.uuid4().hex[:4]}")
        sim.start()
        try:
            run(srv, agent, sim)
        finally:
            sim.stop()


def run(srv: FleetServer, agent: Agent, sim: SimThread) -> None:
    ns = f"drain-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    real, fake = agent.node, sim.cfg.prefix + "-0000"
    with srv.client() as c:
        for n in sim.sim.node_names:  # type: ignore[union-attr]
            wait_until(lambda n=n: get(srv, f"/api/v1/nodes/{n}")[0] == 200, timeout=30,
                       what=f"simulated node {n}")
        # Spread 10 pods over the 5 nodes (pinned, so each node surely has two).
        nodes = [real, *sim.sim.node_names]  # type: ignore[union-attr]
        for i in range(10):
            p = web(f"web-{i}")
            p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes[i % 5]}
            assert c.post(f"/api/v1/namespaces/{ns}/pods", json=p).status_code == 201
        wait_until(lambda: sum(1 for p in pods(srv, ns)
                               if p["status"].get("phase") == "Running") == 10,
                   timeout=90, what="10 pods Running")

    assert "cordoned" in kubectl(srv, "cordon", real)
    assert get(srv, f"/api/v1/nodes/{real}")[1]["spec"].get("unschedulable") is True

    for node in (real, fake):
        before_elsewhere = {p["metadata"]["uid"] for p in pods(srv, ns)
                            if p["spec"].get("nodeName") not in (real, fake)}
        out = kubectl(srv, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
                      "--force", "--timeout=90s")
        assert "drained" in out, out
        assert on_node(srv, ns, node) == [], on_node(srv, ns, node)
        # Nothing elsewhere was touched.
        assert before_elsewhere <= {p["metadata"]["uid"] for p in pods(srv, ns)}
    # The real agent stopped and removed the drained pods' containers.
    wait_until(lambda: not agent.containers(), timeout=30, what="the real node's containers gone")

    # Cordoned nodes get nothing new; uncordoned ones do.
    assert "uncordoned" in kubectl(srv, "uncordon", real)
    assert "uncordoned" in kubectl(srv, "uncordon", fake)
    with srv.client() as c:
        for node in (real, fake):
            p = web(f"back-{node}")
            p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            assert c.post(f"/api/v1/namespaces/{ns}/pods", json=p).status_code == 201
    wait_until(lambda: all(
        get(srv, f"/api/v1/namespaces/{ns}/pods/back-{n}")[1].get("status", {}).get("phase")
        == "Running" for n in (real, fake)), timeout=60, what="pods Running on the uncordoned nodes")
    with srv.client() as c:
        for p in pods(srv, ns):
            c.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
