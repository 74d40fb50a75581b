"""Resource metrics and the HorizontalPodAutoscaler, end to end with real kubectl.

* Simulated nodes (`fleet agent --simulate`): pods declare their usage with the
  `fleet.dev/simulate-cpu` / `-memory` annotations, so load is switched on and
  off exactly.  `kubectl top nodes|pods` (with -A, -l, --containers) show it,
  and an HPA scales a CPU-burning Deployment up to its maximum and — after the
  load stops and its (shortened) scale-down stabilization window passes — back
  down, with kubectl showing the HPA as it would on Kubernetes.  The HPA's work
  is checked on the Deployment's scale subresource first (what the HPA
  writes), then the pods are checked to follow (the Deployment controller's
  work).
* The server's real built-in agent (root, runc, busybox-static): a busybox pod
  burning cpu shows up in `kubectl top pods` with its measured usage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, write_oci_archive
from tests.conftest import (
    KUBECTL,
    REPO_ROOT,
    FleetServer,
    ServerFactory,
    create_namespace,
    free_port,
    run_kubectl,
)
from tests.e2e.helpers import wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

CPU = "fleet.dev/simulate-cpu"
MEMORY = "fleet.dev/simulate-memory"
# The scale-down stabilization window of the test's HPA (300 s by default).
WINDOW = 6
SYNC = 1.0


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=60)
    assert rc == 0, f"kubectl {' '.join(args)}: rc={rc}\n{out}\n{err}"
    return out


def rows(table: str) -> list[list[str]]:
    """kubectl's column output without the header, split on whitespace."""
    return [line.split() for line in table.strip().splitlines()[1:]]


def millicores(text: str) -> float:
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


def scale_of(srv: FleetServer, ns: str, name: str) -> int:
    with srv.client() as c:
        r = c.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale")
    assert r.status_code == 200, r.text
    return int(r.json()["spec"]["replicas"])


def running_pods(srv: FleetServer, ns: str, selector: str) -> list[dict[str, Any]]:
    with srv.client() as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": selector})
    return [p for p in r.json()["items"] if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


# ---------------------------------------------------------------------------------------
# Simulated nodes


@pytest.fixture(scope="module")
def sim_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[FleetServer]:
    """A server (fast metrics and HPA syncs) with three simulated nodes."""
    base = tmp_path_factory.mktemp("autoscaling-sim")
    factory = ServerFactory(base)
    proc: subprocess.Popen[bytes] | None = None
    log_path = base / "simulator.log"
    try:
        srv = factory.start(extra_args=["--metric-resolution", "1",
                                        "--hpa-sync-period", str(SYNC)])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH"))
                                            if p)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleet.cli.main", "agent", "--simulate", "3",
                 "--kubeconfig", str(srv.kubeconfig), "--node-name", "hpa",
                 "--lease-interval", "2", "--simulate-start-delay", "0.2"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)

        def ready_nodes() -> int:
            with srv.client() as c:
                items = c.get("/api/v1/nodes").json()["items"]
            return sum(1 for n in items for cond in n["status"].get("conditions", [])
                       if cond["type"] == "Ready" and cond["status"] == "True")

        wait_until(lambda: ready_nodes() == 3, timeout=60, what="3 simulated nodes Ready")
        yield srv
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        if getattr(request.node, "_fleet_failed", False):
            sys.stderr.write(f"\n----- simulator -----\n{log_path.read_text()[-6000:]}\n")
            for s in factory.servers:
                sys.stderr.write(f"\n----- server -----\n{s.output()[-15000:]}\n")
        problems = factory.stop_all()
        assert not problems, problems


def sim_pod(name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name.rstrip("0123456789-")},
                         "annotations": annotations},
            "spec": {"nodeName": node, "containers": [
                {"name": "web", "image": "nginx:1.27"}, {"name": "log", "image": "busybox"}]}}


def test_kubectl_top_on_simulated_nodes(sim_cluster: FleetServer) -> None:
    srv = sim_cluster
    ns = f"top-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    with srv.client() as c:
        for body in (sim_pod("busy-1", "hpa-0000", {CPU: "300m", MEMORY: "64Mi"}),
                     sim_pod("busy-2", "hpa-0000", {CPU: "100m", MEMORY: "32Mi"}),
                     sim_pod("quiet-1", "hpa-0001", {})):
            r = c.post(f"/api/v1/namespaces/{ns}/pods", json=body)
            assert r.status_code == 201, r.text
    wait_until(lambda: len(running_pods(srv, ns, "")) == 3, timeout=30, what="3 pods Running")

    out = kubectl(srv, "top", "pods", "-n", ns)
    assert sorted(rows(out)) == [["busy-1", "300m", "64Mi"], ["busy-2", "100m", "32Mi"],
                                 ["quiet-1", "0m", "0Mi"]]
    out = kubectl(srv, "top", "pods", "-n", ns, "-l", "app=busy", "--containers")
    assert sorted(rows(out)) == [["busy-1", "log", "150m", "32Mi"],
                                 ["busy-1", "web", "150m", "32Mi"],
                                 ["busy-2", "log", "50m", "16Mi"],
                                 ["busy-2", "web", "50m", "16Mi"]]
    out = kubectl(srv, "top", "pods", "-A")
    assert [ns, "busy-1", "300m", "64Mi"] in rows(out)
    out = kubectl(srv, "top", "pod", "busy-2", "-n", ns)
    assert rows(out) == [["busy-2", "100m", "32Mi"]]

    out = kubectl(srv, "top", "nodes")
    nodes = {r[0]: r for r in rows(out)}
    assert set(nodes) >= {"hpa-0000", "hpa-0001", "hpa-0002"}
    # hpa-0000 runs both busy pods (other tests of the module may add more).
    assert millicores(nodes["hpa-0000"][1]) >= 400
    assert nodes["hpa-0000"][2].endswith("%")
    out = kubectl(srv, "top", "node", "hpa-0001")
    assert rows(out)[0][0] == "hpa-0001"


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{"fleet.dev/simulate-cpu": "200m", "fleet.dev/simulate-memory": "20Mi"}}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        resources: {{requests: {{cpu: 100m, memory: 64Mi}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: web, namespace: {ns}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: web}}
  minReplicas: 1
  maxReplicas: 4
  metrics:
  - type: Resource
    resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 50}}}}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: {window}
      policies: [{{type: Percent, value: 100, periodSeconds: 1}}]
"""


def hpa_status(srv: FleetServer, ns: str) -> dict[str, Any]:
    with srv.client() as c:
        r = c.get(f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/web")
    assert r.status_code == 200, r.text
    return r.json().get("status") or {}


def test_hpa_scales_a_cpu_burning_deployment_up_and_back_down(sim_cluster: FleetServer) -> None:
    srv = sim_cluster
    ns = f"hpa-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    kubectl(srv, "apply", "-f", "-", input=DEPLOYMENT.format(ns=ns, window=WINDOW))

    # -- load on: every pod uses 200% of its request, the target is 50% ------------------
    wait_until(lambda: scale_of(srv, ns, "web") == 4, timeout=60,
               what="the HPA to scale the Deployment to its maximum (4)")
    status = wait_until(lambda: (s := hpa_status(srv, ns)).get("currentReplicas") == 4 and s,
                        timeout=30, what="the HPA status to show 4 replicas")
    conds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conds["AbleToScale"][0] == "True"
    assert conds["ScalingActive"] == ("True", "ValidMetricFound")
    assert status["currentMetrics"][0]["resource"]["name"] == "cpu"
    assert status.get("lastScaleTime")
    # kubectl shows what it shows on Kubernetes.
    out = kubectl(srv, "get", "hpa", "-n", ns)
    assert out.split("\n")[0].split() == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS",
                                          "REPLICAS", "AGE"]
    line = out.split("\n")[1]
    assert line.startswith("web") and "Deployment/web" in line and "/50%" in line
    described = kubectl(srv, "describe", "hpa", "web", "-n", ns)
    assert "SuccessfulRescale" in described and "New size: " in described
    # The pods follow (the Deployment controller's part).
    wait_until(lambda: len(running_pods(srv, ns, "app=web")) == 4, timeout=60,
               what="4 running pods")
    out = kubectl(srv, "top", "pods", "-n", ns, "-l", "app=web")
    assert len(rows(out)) == 4 and all(r[1] == "200m" for r in rows(out)), out

    # -- load off: nothing happens within the window, then back to the minimum ---------
    kubectl(srv, "annotate", "pods", "-n", ns, "-l", "app=web", f"{CPU}=0m", "--overwrite")
    off = time.monotonic()
    wait_until(lambda: scale_of(srv, ns, "web") == 1, timeout=60,
               what="the HPA to scale back down to 1")
    elapsed = time.monotonic() - off
    # The window counts from the last high recommendation, at most a sync before the
    # load went off.
    assert elapsed >= WINDOW - 2 * SYNC, f"scaled down after {elapsed:.1f}s"
    wait_until(lambda: len(running_pods(srv, ns, "app=web")) == 1, timeout=60,
               what="1 running pod")
    status = wait_until(lambda: (s := hpa_status(srv, ns)).get("desiredReplicas") == 1 and s,
                        timeout=30, what="the HPA status to show 1 desired replica")
    events = kubectl(srv, "get", "events", "-n", ns, "--field-selector",
                     "involvedObject.kind=HorizontalPodAutoscaler", "-o", "json")
    messages = [e["message"] for e in json.loads(events)["items"]
                if e["reason"] == "SuccessfulRescale"]
    assert any("New size: 4" in m for m in messages), messages
    assert any("New size: 1; reason: All metrics below target" in m for m in messages), messages


def test_kubectl_autoscale_creates_a_v1_hpa(sim_cluster: FleetServer) -> None:
    srv = sim_cluster
    ns = f"auto-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    kubectl(srv, "create", "deployment", "auto", "--image", "nginx:1.27", "-n", ns)
    # kubectl 1.32 posts an autoscaling/v1 object, as protobuf.
    kubectl(srv, "autoscale", "deployment", "auto", "--min", "2", "--max", "5",
            "--cpu-percent", "60", "-n", ns)
    [row] = rows(kubectl(srv, "get", "hpa", "-n", ns))
    # NAME REFERENCE TARGETS ("cpu: <unknown>/60%") MINPODS MAXPODS REPLICAS AGE
    assert row[:3] == ["auto", "Deployment/auto", "cpu:"] and row[3].endswith("/60%")
    assert row[4:6] == ["2", "5"]
    v1 = json.loads(kubectl(srv, "get", "horizontalpodautoscalers.v1.autoscaling", "auto",
                            "-n", ns, "-o", "json"))
    assert v1["apiVersion"] == "autoscaling/v1"
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 60
    # Below its minimum, the target is raised at once (metrics or not).
    wait_until(lambda: scale_of(srv, ns, "auto") == 2, timeout=30,
               what="the HPA to raise the Deployment to minReplicas")


# ---------------------------------------------------------------------------------------
# The real built-in agent

IMAGE = "localhost/fleet-test/busybox:1"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the oci driver runs runc)")
@pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun")
@pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static")
def test_kubectl_top_shows_a_cpu_burning_pod(fleet_server_factory: ServerFactory) -> None:
    from fleet.runtime.images import ImageStore, import_archive_sync
    from tests.e2e.leaks import finish, wait_clean

    srv = fleet_server_factory.new(extra_args=[
        "--agent-port", str(free_port()), "--agent-network", "none", "--metric-resolution", "1"])
    agent_dir = srv.data_dir / "agent"
    archive = write_oci_archive(build_busybox_image(), srv.data_dir.parent / "busybox.tar", IMAGE)
    import_archive_sync(ImageStore(agent_dir / "images"), archive, IMAGE)
    srv.start()
    ns = f"burn-{uuid.uuid4().hex[:6]}"
    try:
        create_namespace(srv, ns)
        with srv.client() as c:
            r = c.post(f"/api/v1/namespaces/{ns}/pods", json={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "burner", "labels": {"app": "burner"}},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "while :; do :; done"],
                    # A limit keeps the test from taking a whole core of a shared machine.
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}}]}})
            assert r.status_code == 201, r.text
        wait_until(lambda: len(running_pods(srv, ns, "app=burner")) == 1, timeout=60,
                   what="the burner pod Running")

        def burning() -> list[str] | None:
            rc, out, _ = run_kubectl(srv, "top", "pods", "-n", ns, "--containers")
            found = [r for r in rows(out) if r[:2] == ["burner", "main"]] if rc == 0 else []
            return found[0] if found and millicores(found[0][2]) >= 100 else None

        row = wait_until(burning, timeout=40, interval=0.5, what="kubectl top to show the burn")
        assert millicores(row[2]) <= 600  # the 400m limit, with a window's jitter
        out = kubectl(srv, "top", "nodes")
        [node_row] = rows(out)
        assert millicores(node_row[1]) >= 100 and node_row[2].endswith("%")
    finally:
        with srv.client() as c:
            c.delete(f"/api/v1/namespaces/{ns}/pods/burner")
        leaked = wait_clean(agent_dir, timeout=40)
        srv.stop()
        finish(agent_dir, leaked, srv.output())
