"""PodDisruptionBudgets with kubectl 1.32 against a real `fleet server` and simulated nodes.

One server (`--no-agent`) and an in-process simulator (tests/e2e/simnodes.py) whose
nodes run the pods bound to them (Running and Ready 0.2 s after binding) and remove
them when their deletion starts, as a kubelet would.  Pods are bound with `nodeName`
so each test decides where they run.

- `kubectl get pdb` columns and the status the disruption controller keeps (integer and
  percentage budgets, the DisruptionAllowed condition);
- the issue's scenario: a budget of minAvailable 2 over 2 pods blocks `kubectl drain`
  (kubectl retries the 429s), and a third pod lets the drain proceed and finish;
- the same with Fleet's own drain (`POST nodes/{name}/drain`): the blocked pod is listed
  under `blockedByBudget`, and deleting the budget lets the drain complete.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer, run_kubectl
from tests.e2e.helpers import api_get, dump_all, wait_until
from tests.e2e.simnodes import SimNodes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")]

CANNOT_EVICT = "Cannot evict pod as it would violate the pod's disruption budget."


def ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, f"kubectl failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


@pytest.fixture(scope="module")
def nodes(fleet_server: FleetServer) -> Iterator[list[str]]:
    sim = SimNodes(fleet_server, count=6, prefix=f"pdb{uuid.uuid4().hex[:4]}").start()
    try:
        wait_until(lambda: all(ready_node(fleet_server, n) for n in sim.names), timeout=60,
                   what="simulated nodes Ready")
        # The drain tests' nodes run only the pods the tests bind to them: the scheduler
        # must not put other tests' replicas there.
        with fleet_server.client() as c:
            for name in sim.names[2:]:
                r = c.patch(f"/api/v1/nodes/{name}", json={"spec": {"unschedulable": True}},
                            headers={"Content-Type": "application/merge-patch+json"})
                assert r.status_code == 200, r.text
        yield sim.names
    finally:
        sim.stop()


def ready_node(srv: FleetServer, name: str) -> bool:
    code, node = api_get(srv, f"/api/v1/nodes/{name}")
    return code == 200 and any(c["type"] == "Ready" and c["status"] == "True"
                               for c in node.get("status", {}).get("conditions", []))


def pod(name: str, node: str, app: str = "web", owner: dict[str, Any] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": {"app": app}}
    if owner:
        md["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "app", "image": "busybox:1.36"}]}}


def budget(name: str, app: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}


def pdb_status(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    code, body = api_get(srv, f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
    assert code == 200, body
    return body.get("status") or {}


def wait_status(srv: FleetServer, ns: str, name: str, **want: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        s = pdb_status(srv, ns, name)
        return s if all(s.get(k) == v for k, v in want.items()) else None
    return wait_until(check, timeout=30, what=f"pdb {name} status {want}")


def ready_pods(srv: FleetServer, ns: str) -> set[str]:
    code, body = api_get(srv, f"/api/v1/namespaces/{ns}/pods")
    assert code == 200
    return {p["metadata"]["name"] for p in body["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}


def pod_names(srv: FleetServer, ns: str) -> set[str]:
    code, body = api_get(srv, f"/api/v1/namespaces/{ns}/pods")
    assert code == 200
    return {p["metadata"]["name"] for p in body["items"]}


def test_budget_status_and_table(fleet_server: FleetServer, kubectl, namespace: str, nodes: list[str]) -> None:
    ns = namespace
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(
        *(pod(f"w{i}", nodes[i % 2]) for i in range(3)), budget("ints", "web", minAvailable=2))))
    ok(kubectl("create", "pdb", "pct", "-n", ns, "--selector=app=web", "--min-available=50%"))  # protobuf
    wait_until(lambda: len(ready_pods(fleet_server, ns)) == 3, timeout=30, what="3 Ready pods")
    s = wait_status(fleet_server, ns, "ints", currentHealthy=3, desiredHealthy=2, expectedPods=3,
                    disruptionsAllowed=1, observedGeneration=1)
    [cond] = s["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("DisruptionAllowed", "True", "SufficientPods")
    # A percentage needs the pods' controllers; these have none, so nothing may be disrupted.
    wait_status(fleet_server, ns, "pct", expectedPods=0, disruptionsAllowed=0, observedGeneration=1)

    table = ok(kubectl("get", "pdb", "-n", ns))
    lines = [line.split() for line in table.splitlines()]
    assert lines[0] == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    rows = {line[0]: line[1:4] for line in lines[1:]}
    assert rows == {"ints": ["2", "N/A", "1"], "pct": ["50%", "N/A", "0"]}

    assert "minAvailable" in ok(kubectl("explain", "pdb.spec"))

    # A spec change is observed (generation 2) and recounted.
    ok(kubectl("patch", "pdb", "ints", "-n", ns, "--type=merge", "-p", '{"spec":{"minAvailable":3}}'))
    wait_status(fleet_server, ns, "ints", desiredHealthy=3, disruptionsAllowed=0, observedGeneration=2)

    # A pod going away is counted at once.
    ok(kubectl("patch", "pdb", "ints", "-n", ns, "--type=merge", "-p", '{"spec":{"minAvailable":1}}'))
    wait_status(fleet_server, ns, "ints", disruptionsAllowed=2)
    ok(kubectl("delete", "pod", "w0", "-n", ns))
    wait_status(fleet_server, ns, "ints", currentHealthy=2, expectedPods=2, disruptionsAllowed=1)


def test_percentage_budget_of_a_deployment(fleet_server: FleetServer, kubectl, namespace: str,
                                           nodes: list[str]) -> None:
    """maxUnavailable 25% of a 4-replica Deployment: expectedPods is the Deployment's scale."""
    ns = namespace
    ok(kubectl("create", "deployment", "api", "-n", ns, "--image=busybox:1.36", "--replicas=4"))
    ok(kubectl("create", "pdb", "api", "-n", ns, "--selector=app=api", "--max-unavailable=25%"))
    wait_status(fleet_server, ns, "api", expectedPods=4, desiredHealthy=3, currentHealthy=4, disruptionsAllowed=1)
    ok(kubectl("scale", "deployment", "api", "-n", ns, "--replicas=8"))
    wait_status(fleet_server, ns, "api", expectedPods=8, desiredHealthy=6, currentHealthy=8, disruptionsAllowed=2)


def test_kubectl_drain_waits_for_the_budget(fleet_server: FleetServer, namespace: str, nodes: list[str]) -> None:
    ns = namespace
    drained, other = nodes[2], nodes[3]

    ok(run_kubectl(fleet_server, "apply", "-n", ns, "-f", "-", input=dump_all(
        pod("web-1", drained), pod("web-2", other), budget("web", "web", minAvailable=2))))
    wait_status(fleet_server, ns, "web", currentHealthy=2, desiredHealthy=2, disruptionsAllowed=0)

    cache_dir = fleet_server.data_dir.parent / "kubectl-cache"
    drain = subprocess.Popen(
        [KUBECTL or "kubectl", "--kubeconfig", str(fleet_server.kubeconfig), "--cache-dir", str(cache_dir),
         "drain", drained, "--force", "--ignore-daemonsets", "--timeout=120s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # kubectl cordons, then keeps being refused (429) and retrying every 5 s.
        wait_until(lambda: "web-1" in pod_names(fleet_server, ns) and _unschedulable(fleet_server, drained),
                   timeout=30, what="the node cordoned")
        time.sleep(6)  # at least one retry
        assert drain.poll() is None, drain.communicate()
        assert "web-1" in pod_names(fleet_server, ns)

        # A third replica elsewhere: the budget allows one disruption, and the drain proceeds.
        ok(run_kubectl(fleet_server, "apply", "-n", ns, "-f", "-", input=dump_all(pod("web-3", other))))
        out, err = drain.communicate(timeout=90)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == 0, (out, err)
    assert CANNOT_EVICT in err, err
    assert f"node/{drained} drained" in out, out
    wait_until(lambda: "web-1" not in pod_names(fleet_server, ns), timeout=30, what="web-1 gone")
    assert pod_names(fleet_server, ns) == {"web-2", "web-3"}
    wait_status(fleet_server, ns, "web", currentHealthy=2, expectedPods=2, disruptionsAllowed=0)


def _unschedulable(srv: FleetServer, node: str) -> bool:
    code, body = api_get(srv, f"/api/v1/nodes/{node}")
    return code == 200 and body.get("spec", {}).get("unschedulable") is True


def test_fleet_drain_reports_the_blocking_budget(fleet_server: FleetServer, kubectl, namespace: str,
                                                 nodes: list[str]) -> None:
    ns = namespace
    drained, other = nodes[4], nodes[5]
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(
        pod("api-1", drained, app="api"), pod("api-2", other, app="api"), budget("api", "api", minAvailable=2))))
    wait_status(fleet_server, ns, "api", currentHealthy=2, disruptionsAllowed=0)

    with fleet_server.client() as c:
        r = c.post(f"/api/v1/nodes/{drained}/drain", json={"force": True})
    assert r.status_code == 202, r.text

    def drain_state() -> dict[str, Any]:
        code, body = api_get(fleet_server, f"/api/v1/nodes/{drained}/drain")
        assert code == 200, body
        return body

    blocked = wait_until(lambda: (s := drain_state())["blockedByBudget"] and s, timeout=30,
                         what="the drain blocked by the budget")
    assert blocked["phase"] == "Running" and blocked["blockedByBudget"] == [f"{ns}/api-1"]
    time.sleep(1)
    assert drain_state()["phase"] == "Running" and "api-1" in pod_names(fleet_server, ns)

    ok(kubectl("delete", "pdb", "api", "-n", ns))
    done = wait_until(lambda: (s := drain_state())["phase"] != "Running" and s, timeout=60,
                      what="the drain to finish")
    assert done["phase"] == "Complete", json.dumps(done)
    assert done["evicted"] == [f"{ns}/api-1"] and done["blockedByBudget"] == []
    wait_until(lambda: pod_names(fleet_server, ns) == {"api-2"}, timeout=30, what="api-1 gone")
