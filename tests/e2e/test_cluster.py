"""End to end, the whole single-machine cluster: `fleet server` with its built-in agent.

An image built from busybox-static is pushed to Debian's docker-registry on
loopback; a pod referencing it is scheduled, pulled, started under runc in its
own network namespace on the bridge, and becomes Ready through an httpGet
readiness probe; its HTTP port answers on the pod IP; real kubectl then streams
its logs (`logs -f`), runs commands in it (`exec`, exit codes, `exec -i` with
stdin) and deletes it gracefully.  Afterwards the bridge, the nftables table
and the pod network namespaces the cluster made are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, push
from tests.conftest import FleetServer, create_namespace, free_port
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import delete_pods_and_wait_clean, finish
from tests.e2e.test_image_registry import REGISTRY_BIN, Registry

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runc, bridge networking)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(REGISTRY_BIN is None, reason="needs docker-registry"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
]

BRIDGE = "fleete2e0"
CLUSTER_CIDR = "10.244.0.0/16"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    base = tmp_path / "registry"
    base.mkdir()
    reg = Registry(base, free_port())
    try:
        yield reg.start()
    finally:
        reg.stop()


@pytest.fixture
def cluster(fleet_server_factory: Any, registry: Registry) -> Iterator[tuple[FleetServer, str, str]]:
    trio.run(push, build_busybox_image(), registry.url, "e2e/busybox", "v1")
    image = f"{registry.host}/e2e/busybox:v1"
    # The built-in agent's bridge gets a test-only name, so a developer's own
    # cluster on this machine is never touched.
    srv = fleet_server_factory.start(extra_args=[
        "--agent-port", str(free_port()), "--agent-network", "bridge", "--agent-bridge", BRIDGE,
        "--cluster-cidr", CLUSTER_CIDR])
    ns = f"cl-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    agent_dir = srv.data_dir / "agent"
    try:
        yield srv, ns, image
    finally:
        leaked = delete_pods_and_wait_clean(srv, agent_dir, ns)
        srv.stop()
        # Removes the bridge and nft table too; fails the test on a leak.
        finish(agent_dir, leaked, srv.output())


def _pod(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    with srv.client() as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def test_pod_from_registry_runs_and_answers_kubectl(cluster: tuple[FleetServer, str, str]) -> None:
    srv, ns, image = cluster
    manifest = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "web", "image": image, "imagePullPolicy": "Always",
                # `;` not `&&` before the background loop: `a && b & c` would send
                # a and b to the background too, racing httpd for /www.
                "command": ["sh", "-c",
                            "mkdir -p /www; echo hello-from-pod > /www/index.html; "
                            "(i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.5; done) & "
                            "exec httpd -f -p 8080 -h /www"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080},
                                   "periodSeconds": 1},
            }],
        },
    }
    rc, out, err = srv.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    assert rc == 0, err

    def ready() -> dict[str, Any] | None:
        p = _pod(srv, ns, "web")
        conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
        return p if conds.get("Ready") == "True" and p["status"].get("podIP") else None

    try:
        pod = wait_until(ready, timeout=60, what="the pod to become Ready")
    except AssertionError:
        log = srv.log_path.read_text(errors="replace")[-6000:] if srv.log_path.exists() else ""
        raise AssertionError(f"pod never became Ready: {json.dumps(_pod(srv, ns, 'web').get('status'))}"
                             f"\n----- server log -----\n{log}") from None
    assert pod["spec"]["nodeName"], "the scheduler bound it"
    ip = pod["status"]["podIP"]
    assert ip.startswith("10.244."), ip
    cs = pod["status"]["containerStatuses"][0]
    assert cs["ready"] and "running" in cs["state"] and cs["imageID"]
    assert cs["restartCount"] == 0, cs

    # The pod's HTTP port answers on its own IP (the pod's netns, on the bridge).
    assert httpx.get(f"http://{ip}:8080/index.html", timeout=5).text.strip() == "hello-from-pod"

    # kubectl logs -f streams: the ticks keep coming while it follows.
    proc = subprocess.Popen(["kubectl", "--kubeconfig", str(srv.kubeconfig), "-n", ns, "logs", "-f", "web"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 20
        assert proc.stdout is not None
        while time.monotonic() < deadline and len(seen) < 4:
            line = proc.stdout.readline()
            if line.startswith("tick"):
                seen.append(line)
        assert len(seen) >= 4, seen
    finally:
        proc.kill()
        proc.wait(timeout=10)

    rc, out, err = srv.kubectl("-n", ns, "exec", "web", "--", "sh", "-c", "echo in-pod; exit 3")
    assert rc == 3 and "in-pod" in out, (rc, out, err)
    rc, out, err = srv.kubectl("-n", ns, "exec", "-i", "web", "--", "cat", input="through stdin\n")
    assert rc == 0 and out == "through stdin\n", (rc, out, err)

    # Graceful deletion: Terminating first, then gone once the agent stopped it.
    rc, out, err = srv.kubectl("-n", ns, "delete", "pod", "web", "--wait=true", timeout=60)
    assert rc == 0, err
    with srv.client() as c:
        assert c.get(f"/api/v1/namespaces/{ns}/pods/web").status_code == 404
