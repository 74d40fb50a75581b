"""The cluster PKI end to end: a real `fleet server` with its built-in agent (runc, a
bridge of its own) and leaf certificates that live 30 seconds.

* kubectl with only the admin client certificate (no token) works;
* a certificate from another CA, an expired one: 401 `Unauthorized`, nothing more;
* the agent API (HTTPS, its certificate from the server CA) refuses callers without
  a client-CA certificate of the API server's group, and serves the server's;
* `fleet certs check` lists CAs and leaves; `fleet certs rotate --ca all` while
  pods run: logs/exec through the agent, kubectl with the rewritten kubeconfig and
  with a kubeconfig saved before the rotation (old CA, old certificate) all work;
* leaves renew every ~20 s while the scheduler, controllers and agent keep working.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from fleet.auth.pki import ClusterPKI, load_pem_chain, subject_for
from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import FleetServer, _server_env
from tests.e2e.agentcluster import agent_cluster
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent import IMAGE

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the oci driver runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
]

BRIDGE = "fpki0"
CLUSTER_CIDR = "10.236.0.0/16"
LIFETIME = 30  # seconds, every leaf


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    with agent_cluster(request, tmp_path_factory.mktemp("pki"), bridge=BRIDGE, cluster_cidr=CLUSTER_CIDR,
                       delete_pods=True, grace=0,
                       extra_args=["--cert-lifetime", str(LIFETIME)]) as srv:
        yield srv


# ---------------------------------------------------------------------- helpers

def kubeconfig(srv: FleetServer) -> dict[str, Any]:
    return yaml.safe_load(srv.kubeconfig.read_text())


def cert_only_kubeconfig(srv: FleetServer, path: Path) -> Path:
    """The admin kubeconfig as it is now, without the token: the certificate alone."""
    cfg = kubeconfig(srv)
    user = cfg["users"][0]["user"]
    user.pop("token")
    assert user["client-certificate-data"] and user["client-key-data"]
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def kubectl(kcfg: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", str(kcfg), *args], capture_output=True, text=True,
                          timeout=timeout, env=_server_env())


def pem_pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[bytes, bytes]:
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def client_cert(ca_cert: x509.Certificate, ca_key: Any, cn: str, orgs: tuple[str, ...], *,
                not_before: dt.datetime, not_after: dt.datetime) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(subject_for(cn, orgs)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return pem_pair(cert, key)


def https(trust: bytes, cert: tuple[bytes, bytes] | None, tmp: Path) -> httpx.Client:
    ctx = ssl.create_default_context(cadata=trust.decode())
    if cert is not None:
        name = uuid.uuid4().hex[:8]
        (tmp / f"{name}.crt").write_bytes(cert[0])
        (tmp / f"{name}.key").write_bytes(cert[1])
        ctx.load_cert_chain(str(tmp / f"{name}.crt"), str(tmp / f"{name}.key"))
    return httpx.Client(verify=ctx, timeout=10)


def server_pki(srv: FleetServer) -> ClusterPKI:
    pki = ClusterPKI(srv.data_dir)
    pki.load()
    return pki


def agent_url(srv: FleetServer) -> str:
    with srv.client() as c:
        node = c.get("/api/v1/nodes").json()["items"][0]
    assert node["metadata"]["annotations"]["fleet.dev/agent-api-scheme"] == "https"
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    return f"https://127.0.0.1:{port}"


def fleet_certs(srv: FleetServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet.cli.main", "certs", *args, "--data-dir",
                           str(srv.data_dir)], capture_output=True, text=True, timeout=60,
                          env=_server_env())


def run_pod(srv: FleetServer, kcfg: Path, name: str) -> None:
    r = kubectl(kcfg, "run", name, f"--image={IMAGE}", "--image-pull-policy=Never", "--restart=Never",
                "--", "sh", "-c", f"echo hello-{name}; sleep 3600")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: kubectl(kcfg, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
               == "Running", timeout=60, what=f"pod {name} Running")


def fresh(srv: FleetServer, tmp: Path) -> Path:
    return cert_only_kubeconfig(srv, tmp / f"admin-{uuid.uuid4().hex[:6]}.kubeconfig")


# ---------------------------------------------------------------------- tests

def test_kubectl_with_the_admin_certificate_alone(cluster: FleetServer, tmp_path: Path) -> None:
    kcfg = fresh(cluster, tmp_path)
    r = kubectl(kcfg, "get", "namespaces", "-o", "name")
    assert r.returncode == 0, r.stderr
    assert "namespace/kube-system" in r.stdout.split()
    run_pod(cluster, kcfg, "hello")
    r = kubectl(kcfg, "logs", "hello")
    assert r.returncode == 0 and r.stdout.strip() == "hello-hello", r.stderr
    r = kubectl(kcfg, "exec", "hello", "--", "echo", "exec-ok")
    assert r.returncode == 0 and r.stdout.strip() == "exec-ok", r.stderr


def test_certificate_of_another_ca_is_a_bare_401(cluster: FleetServer, tmp_path: Path) -> None:
    other = ClusterPKI(tmp_path / "other")
    other.ensure([])
    cert = other.issue_client_cert("system:admin", ["system:masters"])
    with https(server_pki(cluster).server_ca_bundle_pem(), cert, tmp_path) as c:
        r = c.get(cluster.url + "/api/v1/namespaces")
    assert r.status_code == 401
    assert r.json()["message"] == "Unauthorized" and r.json()["reason"] == "Unauthorized"
    assert "unknown authority" in cluster.output()  # the reason is in the log only


def test_expired_and_not_yet_valid_certificates_are_401(cluster: FleetServer, tmp_path: Path) -> None:
    pki = server_pki(cluster)
    ca = pki.ca("client")
    now = dt.datetime.now(dt.UTC)
    expired = client_cert(ca.cert, ca.key, "system:admin", ("system:masters",),
                          not_before=now - dt.timedelta(hours=2), not_after=now - dt.timedelta(hours=1))
    future = client_cert(ca.cert, ca.key, "system:admin", ("system:masters",),
                         not_before=now + dt.timedelta(hours=1), not_after=now + dt.timedelta(hours=2))
    valid = client_cert(ca.cert, ca.key, "jane", ("devs",),
                        not_before=now - dt.timedelta(minutes=1), not_after=now + dt.timedelta(hours=1))
    # A valid certificate authenticates: jane has no grant, so 403 naming her, in
    # Kubernetes' words; the bad ones are a bare 401.
    for cert, code in ((expired, 401), (future, 401), (valid, 403)):
        with https(pki.server_ca_bundle_pem(), cert, tmp_path) as c:
            r = c.get(cluster.url + "/api/v1/namespaces/default")
        assert r.status_code == code, r.text
        if code == 401:
            assert r.json()["message"] == "Unauthorized"
        else:
            assert r.json()["message"] == ('namespaces "default" is forbidden: User "jane" cannot get '
                                           'resource "namespaces" in API group "" at the cluster scope')
    assert "has expired" in cluster.output() and "is not yet valid" in cluster.output()


def test_agent_api_requires_the_servers_client_certificate(cluster: FleetServer, tmp_path: Path) -> None:
    pki = server_pki(cluster)
    url = agent_url(cluster) + "/stats/summary"
    trust = pki.server_ca_bundle_pem()  # the agent's serving certificate is the server CA's
    other = ClusterPKI(tmp_path / "other")
    other.ensure([])
    callers = [
        (None, 401),
        (other.issue_client_cert("fleet-apiserver-kubelet-client", ["system:masters"]), 401),
        (pki.issue_client_cert("system:node:intruder", ["system:nodes"]), 403),
        (pki.issue_client_cert("fleet-apiserver-kubelet-client", ["system:masters"]), 200),
    ]
    for cert, code in callers:
        with https(trust, cert, tmp_path) as c:
            r = c.get(url)
        assert r.status_code == code, (cert and load_pem_chain(cert[0])[0].subject, r.text)
    # The admin token is no key to a TLS agent either (the server never sends it there).
    with https(trust, None, tmp_path) as c:
        assert c.get(url, headers={"Authorization": f"Bearer {cluster.token}"}).status_code == 401
    # And a client that trusts only the system CAs does not accept the agent.
    with pytest.raises(httpx.ConnectError), httpx.Client(timeout=5) as c:
        c.get(url)


def test_certs_check_lists_cas_and_leaves(cluster: FleetServer) -> None:
    r = fleet_certs(cluster, "check")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SUBJECT", "ISSUER", "NOT", "AFTER", "DAYS", "LEFT", "STATUS"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert {"server-ca", "client-ca", "requestheader-ca", "apiserver", "admin"} <= set(rows)
    assert "CN=system:admin,O=system:masters" in rows["admin"]
    assert all(ln.split()[-1] in ("OK", "RENEW-DUE") for ln in lines[1:])


def test_rotate_all_cas_while_the_cluster_runs(cluster: FleetServer, tmp_path: Path) -> None:
    before = fresh(cluster, tmp_path)  # trusts only the old server CA; old admin cert
    old_ca = load_pem_chain(base64.b64decode(kubeconfig(cluster)["clusters"][0]["cluster"]
                                             ["certificate-authority-data"]))
    assert len(old_ca) == 1
    r = fleet_certs(cluster, "rotate", "--ca", "all", "--overlap", "600")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("rotated the") == 3

    def picked_up() -> bool:
        bundle = load_pem_chain(base64.b64decode(kubeconfig(cluster)["clusters"][0]["cluster"]
                                                 ["certificate-authority-data"]))
        return len(bundle) == 2 and bundle[1] == old_ca[0]
    wait_until(picked_up, timeout=30, what="the server to pick up the new CAs")
    # A client from before the rotation: the serving certificate (new CA) chains to the
    # old CA through the cross certificate, and the old client CA is still trusted.
    r = kubectl(before, "get", "pods", "-o", "name")
    assert r.returncode == 0, r.stderr
    after = fresh(cluster, tmp_path)
    r = kubectl(after, "logs", "hello")
    assert r.returncode == 0 and r.stdout.strip() == "hello-hello", r.stderr
    run_pod(cluster, after, "after-rotation")
    r = kubectl(after, "exec", "after-rotation", "--", "echo", "still-ok")
    assert r.returncode == 0 and r.stdout.strip() == "still-ok", r.stderr
    r = fleet_certs(cluster, "check")
    assert "server-ca (previous)" in r.stdout and "client-ca (previous)" in r.stdout


def test_short_lived_leaves_renew_while_everything_keeps_working(cluster: FleetServer,
                                                                 tmp_path: Path) -> None:
    host, port = cluster.url.removeprefix("https://").rsplit(":", 1)
    agent_host, agent_port = agent_url(cluster).removeprefix("https://").rsplit(":", 1)

    def serials() -> tuple[int, int]:
        api = ssl.get_server_certificate((host, int(port)))
        agent = ssl.get_server_certificate((agent_host, int(agent_port)))
        return (load_pem_chain(api.encode())[0].serial_number,
                load_pem_chain(agent.encode())[0].serial_number)

    seen = [serials()]
    start = time.monotonic()
    while time.monotonic() - start < 2.2 * LIFETIME:
        r = kubectl(fresh(cluster, tmp_path), "get", "pods", "-o", "name")
        assert r.returncode == 0, r.stderr
        seen.append(serials())
        time.sleep(3)
    assert len({s[0] for s in seen}) >= 3, "the API serving certificate did not renew"
    assert len({s[1] for s in seen}) >= 3, "the agent serving certificate did not renew"
    # The components' certificates renewed too: a Deployment still gets its pod
    # (controller manager, scheduler) and the agent runs it and serves its logs.
    kcfg = fresh(cluster, tmp_path)
    r = kubectl(kcfg, "create", "deployment", "late", f"--image={IMAGE}", "--", "sh", "-c",
                "echo late-ok; sleep 3600")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: "late-ok" in kubectl(fresh(cluster, tmp_path), "logs", "deployment/late").stdout,
               timeout=90, what="the Deployment's pod running and logging")
