"""A real `fleet server` and a real `fleet agent` (oci driver, runc) running pods.

The busybox test image is imported into the agent's image store before it starts;
pods are created with spec.nodeName set (no scheduler needed).  At the end the pods
are deleted through the API and the agent must remove everything of them by itself
(tests/e2e/leaks.py): a leftover is cleaned up by `fleet killall` and fails the test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, write_oci_archive
from tests.conftest import FleetServer, _server_env, create_namespace, free_port
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import delete_pods_and_wait_clean, finish

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the oci driver runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
]

IMAGE = "localhost/fleet-test/busybox:1"


class Agent:
    def __init__(self, srv: FleetServer, base: Path, name: str) -> None:
        self.srv = srv
        self.data_dir = base / "agent"
        self.node = name
        self.port = free_port()
        self.log_path = base / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "fleet.cli.main", "agent", "--kubeconfig",
                str(self.srv.kubeconfig), "--data-dir", str(self.data_dir),
                "--node-name", self.node, "--port", str(self.port), "--driver", "oci",
                "--network", "none", "--address", "127.0.0.1"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=_server_env(),
                                         start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except FileNotFoundError:
            return ""


@pytest.fixture
def cluster(fleet_server_factory: Any) -> Iterator[tuple[FleetServer, Agent, str]]:
    srv = fleet_server_factory.start()
    base = srv.data_dir.parent
    agent = Agent(srv, base, f"node-{uuid.uuid4().hex[:6]}")
    store = ImageStore(agent.data_dir / "images")
    archive = write_oci_archive(build_busybox_image(), base / "busybox.tar", IMAGE)
    import_archive_sync(store, archive, IMAGE)
    ns = f"agent-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    agent.start()
    try:
        yield srv, agent, ns
    finally:
        leaked: list[str] = []
        try:
            if agent.proc is not None and agent.proc.poll() is None:
                # The agent must remove everything of the deleted pods by itself.
                leaked = delete_pods_and_wait_clean(srv, agent.data_dir, ns)
        finally:
            agent.stop()
            finish(agent.data_dir, leaked, agent.output())
            shutil.rmtree(agent.data_dir, ignore_errors=True)


def pod(name: str, node: str, command: list[str], restart: str = "Always",
        grace: int = 2) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": restart,
                     "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": IMAGE,
                                     "imagePullPolicy": "Never", "command": command}]}}


def get(srv: FleetServer, path: str) -> tuple[int, Any]:
    with srv.client() as c:
        r = c.get(path)
    return r.status_code, r.json()


def create(srv: FleetServer, ns: str, body: dict[str, Any]) -> None:
    with srv.client() as c:
        r = c.post(f"/api/v1/namespaces/{ns}/pods", json=body)
    assert r.status_code == 201, r.text


def pod_status(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    code, body = get(srv, f"/api/v1/namespaces/{ns}/pods/{name}")
    return body.get("status") or {} if code == 200 else {}


def test_agent_runs_pods(cluster: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = cluster
    try:
        def node_ready() -> bool:
            code, node = get(srv, f"/api/v1/nodes/{agent.node}")
            if code != 200:
                return False
            conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions", [])}
            return code == 200 and conds.get("Ready") == "True"
        wait_until(node_ready, timeout=30, what="node Ready")
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{agent.node}"
        lease = wait_until(lambda: (r := get(srv, lease_path))[0] == 200 and r[1], timeout=10,
                           what="the node lease")
        assert lease["spec"]["holderIdentity"] == agent.node
        first_renew = lease["spec"]["renewTime"]
        assert len(lease["spec"]["renewTime"].split(".")[1]) == 7  # 6 digits + Z

        create(srv, ns, pod("run", agent.node, ["sh", "-c", "echo hi; sleep 3600"]))
        create(srv, ns, pod("fail", agent.node, ["sh", "-c", "exit 3"], restart="Never"))
        create(srv, ns, pod("ok", agent.node, ["true"], restart="OnFailure"))
        create(srv, ns, pod("trap", agent.node,
                            ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
                            grace=20))

        st = wait_until(lambda: (s := pod_status(srv, ns, "run")).get("phase") == "Running" and s,
                        timeout=30, what="pod Running")
        cs = st["containerStatuses"][0]
        assert "running" in cs["state"] and cs["containerID"].startswith("fleet://")
        assert st["podIP"] and cs["restartCount"] == 0
        st = wait_until(lambda: (s := pod_status(srv, ns, "fail")).get("phase") == "Failed" and s,
                        timeout=30, what="pod Failed")
        assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        wait_until(lambda: pod_status(srv, ns, "ok").get("phase") == "Succeeded", timeout=30,
                   what="pod Succeeded")

        # Deletion: the TERM trap exits at once, so the pod is gone well within its grace.
        wait_until(lambda: pod_status(srv, ns, "trap").get("phase") == "Running", timeout=30,
                   what="trap pod Running")
        t0 = time.monotonic()
        with srv.client() as c:
            assert c.delete(f"/api/v1/namespaces/{ns}/pods/trap").status_code in (200, 202)
        wait_until(lambda: get(srv, f"/api/v1/namespaces/{ns}/pods/trap")[0] == 404,
                   timeout=20, what="trap pod gone")
        assert time.monotonic() - t0 < 20

        # SIGKILL the agent: the container keeps running and is re-adopted as is.
        pid = _container_pid(agent, "run")
        agent.kill()
        time.sleep(0.5)
        os.kill(pid, 0)
        agent.start()
        time.sleep(3)
        st = wait_until(lambda: (s := pod_status(srv, ns, "run")).get("phase") == "Running" and s,
                        timeout=30, what="pod Running after restart")
        assert st["containerStatuses"][0]["restartCount"] == 0
        assert _container_pid(agent, "run") == pid
        os.kill(pid, 0)
        # The lease is renewed (by the heartbeat, and again by the new agent): waited for, since
        # a restarted agent on a loaded machine may not have renewed it yet.
        wait_until(lambda: get(srv, lease_path)[1]["spec"]["renewTime"] != first_renew, timeout=20,
                   what="the lease renewed")
    except BaseException:
        sys.stderr.write(f"\n----- agent output -----\n{agent.output()}\n")
        raise


def _container_pid(agent: Agent, pod_name: str) -> int:
    import json
    for d in (agent.data_dir / "runtime" / "containers").iterdir():
        try:
            h = json.loads((d / "handle.json").read_text())
        except (OSError, ValueError):
            continue
        if h["labels"].get("fleet.io/pod-name") == pod_name:
            return int(h["pid"])
    raise AssertionError(f"no container of {pod_name}")


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _conditions(st: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in st.get("conditions") or []}


def test_agent_probes(cluster: tuple[FleetServer, Agent, str]) -> None:
    """Readiness (exec and httpGet) and liveness probes through real `runc exec`.

    The agent runs with `--network none`, so pods share the node's network and their
    pod IP is the node address (127.0.0.1): the httpGet probe reaches busybox httpd
    there, on a free port.  Probes on a pod's own network namespace (bridge driver)
    are not covered here: that agent mode changes the host's network."""
    srv, agent, ns = cluster
    try:
        ready = pod("ready", agent.node,
                    ["sh", "-c", "sleep 2; touch /tmp/ready; exec sleep 3600"], grace=1)
        # timeoutSeconds leaves room for a slow `runc exec` on a loaded CI machine: a
        # probe that times out only delays readiness, it cannot fail the test.
        ready["spec"]["containers"][0]["readinessProbe"] = {
            "exec": {"command": ["sh", "-c", "test -f /tmp/ready"]},
            "periodSeconds": 1, "timeoutSeconds": 5}
        create(srv, ns, ready)

        live = pod("live", agent.node, ["sleep", "3600"], grace=1)
        live["spec"]["containers"][0]["livenessProbe"] = {
            "exec": {"command": ["sh", "-c", "exit 1"]},
            "periodSeconds": 1, "failureThreshold": 1}
        create(srv, ns, live)

        port = free_port()
        web = pod("web", agent.node, ["httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/etc"],
                  grace=1)
        web["spec"]["containers"][0]["readinessProbe"] = {
            "httpGet": {"path": "/passwd", "port": port},
            "periodSeconds": 1, "timeoutSeconds": 5}
        create(srv, ns, web)

        st = wait_until(lambda: _conditions(s := pod_status(srv, ns, "ready")).get("Ready")
                        == "True" and s, timeout=40, what="pod ready Ready=True")
        cs = st["containerStatuses"][0]
        assert cs["ready"] is True and cs["started"] is True and cs["restartCount"] == 0
        assert _conditions(st)["ContainersReady"] == "True"
        # Not ready before the file existed: Ready turned True ≥ 2 s after the start
        # (whole-second timestamps, so a container ready at once would show ≤ 1 s).
        became_ready = next(c["lastTransitionTime"] for c in st["conditions"]
                            if c["type"] == "Ready")
        assert _ts(became_ready) - _ts(cs["state"]["running"]["startedAt"]) >= 2

        st = wait_until(lambda: _conditions(s := pod_status(srv, ns, "web")).get("Ready")
                        == "True" and s, timeout=40, what="pod web Ready=True")
        assert st["podIP"] == "127.0.0.1"

        def restarted() -> dict[str, Any] | None:
            s = pod_status(srv, ns, "live")
            cs = (s.get("containerStatuses") or [{}])[0]
            return cs if cs.get("restartCount", 0) >= 1 and \
                "terminated" in (cs.get("lastState") or {}) else None

        # Killed at the first failed probe (≈1 s) after a 1 s grace period, then the
        # 10 s back-off before the restart.
        cs = wait_until(restarted, timeout=60, what="pod live restarted by its liveness probe")
        term = cs["lastState"]["terminated"]
        assert term["exitCode"] in (137, 143), term
        assert term["message"].startswith("Liveness probe failed:"), term
        assert "will be restarted" in term["message"]
    except BaseException:
        sys.stderr.write(f"\n----- agent output -----\n{agent.output()}\n")
        raise
