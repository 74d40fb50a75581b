"""The README's first command, minus the install: `fleet server` with its built-in agent,
the example image built by packaging/build_example_image.py and imported with
`kfleet image import`, then packaging/examples/hello.yaml applied with kubectl — the
Deployment's two replicas become Ready and each serves the page on its pod IP; from
inside a pod the `hello` Service answers on its ClusterIP and its name resolves through
the cluster DNS (search path `<ns>.svc.cluster.local`); from the host, the example's
Ingress answers through the server's ingress port."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import KUBECTL, REPO_ROOT, ServerFactory, _server_env, free_port, run_kubectl
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import finish, wait_clean
from tests.e2e.test_agent import get

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the built-in agent runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
]

BRIDGE = "fleetqs0"


def test_readme_example_workload(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    ingress_port = free_port()
    srv = fleet_server_factory.start(extra_args=[
        "--ingress-bind", "127.0.0.1", "--ingress-http-port", str(ingress_port),
        "--ingress-https-port", "0",
        "--agent-port", str(free_port()), "--agent-network", "bridge", "--agent-bridge", BRIDGE,
        "--cluster-cidr", "10.245.0.0/16",
        # The test server listens on loopback only: pods reach its DNS on the bridge.
        "--cluster-dns-advertise", "10.245.0.1"])
    ns = f"qs-{uuid.uuid4().hex[:6]}"
    try:
        image = tmp_path / "busybox-fleet.tar"
        env = _server_env()
        subprocess.run([sys.executable, str(REPO_ROOT / "packaging" / "build_example_image.py"),
                        str(image)], check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig", str(srv.kubeconfig),
                        "image", "import", str(image)], check=True, capture_output=True, env=env,
                       timeout=120)
        rc, out, err = run_kubectl(srv, "create", "namespace", ns)
        assert rc == 0, err
        rc, out, err = run_kubectl(srv, "apply", "-n", ns, "-f",
                                   str(REPO_ROOT / "packaging" / "examples" / "hello.yaml"))
        assert rc == 0 and "deployment.apps/hello created" in out, (out, err)
        rc, out, err = run_kubectl(srv, "rollout", "status", "-n", ns, "deployment/hello",
                                   "--timeout=120s", timeout=150)
        assert rc == 0 and "successfully rolled out" in out, (out, err)
        pods = [p for p in get(srv, f"/api/v1/namespaces/{ns}/pods")[1]["items"]
                if p["metadata"]["labels"].get("app") == "hello"]
        assert len(pods) == 2
        for p in pods:
            ip = p["status"]["podIP"]
            body = wait_until(lambda ip=ip: _fetch(f"http://{ip}:8080/index.html"), timeout=30,
                              what=f"the page on {ip}")
            assert body.strip() == "hello from fleet"
        svc = get(srv, f"/api/v1/namespaces/{ns}/services/hello")[1]
        cip = svc["spec"]["clusterIP"]
        rc, out, err = run_kubectl(srv, "exec", "-n", ns, "deploy/hello", "--", "wget", "-q", "-O", "-",
                                   f"http://{cip}/index.html")
        assert rc == 0 and out.strip() == "hello from fleet", (rc, out, err)
        # busybox's nslookup goes on through every search domain after the answer and
        # exits 1 for the NXDOMAINs of the others (as it does against CoreDNS): the
        # answer itself is what counts.
        rc, out, err = run_kubectl(srv, "exec", "-n", ns, "deploy/hello", "--", "nslookup", "hello")
        assert f"Name:\thello.{ns}.svc.cluster.local\nAddress: {cip}" in out, (rc, out, err)
        # By name: the short one through the search path, and the full one.
        for host in ("hello", f"hello.{ns}.svc.cluster.local"):
            rc, out, err = run_kubectl(srv, "exec", "-n", ns, "deploy/hello", "--", "wget", "-q", "-O",
                                       "-", f"http://{host}/index.html")
            assert rc == 0 and out.strip() == "hello from fleet", (host, rc, out, err)
        # The Ingress got the default class `fleet` and is served on the ingress port.
        ing = get(srv, f"/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses/hello")[1]
        assert ing["spec"]["ingressClassName"] == "fleet", ing
        body = wait_until(lambda: _fetch(f"http://127.0.0.1:{ingress_port}/index.html"), timeout=30,
                          what="the page through the ingress")
        assert body.strip() == "hello from fleet"
    finally:
        # Deleting the namespace takes the Deployment, its ReplicaSet and pods with it
        # (kubectl waits until it is gone); the agent removes everything of them.
        leaked: list[str] = []
        try:
            rc, out, err = run_kubectl(srv, "delete", "namespace", ns, "--timeout=120s", timeout=150)
            assert rc == 0, (out, err)
            leaked = wait_clean(srv.data_dir / "agent", timeout=40)
        finally:
            # Whatever happened above, nothing of the cluster outlives the test:
            # `fleet killall` removes the bridge and nft table (and fails on a leak).
            fleet_server_factory.stop_all()
            finish(srv.data_dir / "agent", leaked, srv.output())


def _fetch(url: str) -> str | None:
    try:
        r = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None
