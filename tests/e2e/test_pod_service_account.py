"""A pod's way to the API, end to end: the `kubernetes` Service, its service-link
variables, the `kube-root-ca.crt` ConfigMap, and the bound ServiceAccount token
mounted at /var/run/secrets/kubernetes.io/serviceaccount.

`fleet server` with its built-in agent (runc, bridge `fs-sabr0`, a test-only cluster
CIDR, the agent's Service rules), listening on every address and advertising the
bridge's gateway, so the `kubernetes` Service's endpoint is an address the pods can
reach (with the default loopback listener it would not be).  Traffic goes only between
the pods' namespaces, the test's bridge and the host.

`test_pod_gets_a_bound_service_account_token` needs the TokenRequest API
(`serviceaccounts/token`, the tokens work of issue 14): the ServiceAccount admission
plugin adds the `kube-api-access-*` volume only on a server that serves it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
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

BRIDGE = "fs-sabr0"
CLUSTER_CIDR = "10.236.0.0/16"
GATEWAY = "10.236.0.1"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture
def cluster(fleet_server_factory: Any, tmp_path: Path) -> Iterator[tuple[FleetServer, str, str]]:
    reg = Registry(tmp_path / "registry", free_port())
    (tmp_path / "registry").mkdir()
    reg.start()
    srv: FleetServer | None = None
    ns = f"fs-sa-{uuid.uuid4().hex[:6]}"
    try:
        trio.run(push, build_busybox_image(), reg.url, "e2e/busybox", "v1")
        srv = fleet_server_factory.start(extra_args=[
            "--agent-port", str(free_port()), "--agent-network", "bridge", "--agent-bridge", BRIDGE,
            "--cluster-cidr", CLUSTER_CIDR, "--address", "0.0.0.0",
            # The `kubernetes` Service's endpoint: the gateway of the test's bridge (the
            # node's first /24), an address of this host that its pods can reach.
            "--advertise-address", GATEWAY])
        create_namespace(srv, ns)
        yield srv, ns, f"{reg.host}/e2e/busybox:v1"
    finally:
        if srv is not None:
            agent_dir = srv.data_dir / "agent"
            leaked = delete_pods_and_wait_clean(srv, agent_dir, ns)
            srv.stop()
            finish(agent_dir, leaked, srv.output())
        reg.stop()


def _create_pod(srv: FleetServer, ns: str, image: str, name: str, **spec: Any) -> dict[str, Any]:
    with srv.client() as c:
        r = c.post(f"/api/v1/namespaces/{ns}/pods", json={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, **spec,
                     "containers": [{"name": "c", "image": image, "command": ["sh", "-c", "sleep 3600"]}]}})
    assert r.status_code == 201, r.text
    return r.json()


def _running(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with srv.client() as c:
            p = c.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()
        return p if p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP") else None
    return wait_until(check, timeout=90, what=f"pod {name} Running")


def _exec(srv: FleetServer, ns: str, pod: str, script: str) -> str:
    rc, out, err = srv.kubectl("-n", ns, "exec", pod, "--", "sh", "-c", script, timeout=60)
    assert rc == 0, f"{script}: {rc} {out} {err}"
    return out


def _server_ca(srv: FleetServer) -> str:
    return (srv.data_dir / "tls" / "ca.crt").read_text()


def _root_ca_configmap(srv: FleetServer, ns: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with srv.client() as c:
            r = c.get(f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt")
        return r.json() if r.status_code == 200 else None
    return wait_until(check, timeout=30, what="kube-root-ca.crt published")


def _client_hello() -> str:
    """A TLS ClientHello (base64) for `kubernetes.default.svc`, from Python's ssl.  The
    image's busybox wget cannot speak HTTPS (its TLS code crashes), so the pod sends
    this through `nc` and the test reads the first bytes of the server's answer."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname="kubernetes.default.svc")
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return base64.b64encode(outgoing.read()).decode()


def _tls_answer_from_pod(srv: FleetServer, ns: str, pod: str) -> list[str]:
    """The first bytes (hex) the API server answers a ClientHello sent from `pod` to
    $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.  Asked until there is an answer:
    the node's Service rules are not waited for at agent start, so the first pod may
    run before the `kubernetes` Service is programmed."""
    script = (f"echo {_client_hello()} | base64 -d | "
              "nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT 2>/dev/null | "
              "head -c 3 | od -An -tx1")
    return wait_until(lambda: _exec(srv, ns, pod, script).split(), timeout=30, interval=1,
                      what=f"a TLS answer to {pod} through the kubernetes Service")


def _jwt_claims(token: str) -> dict[str, Any]:
    """A JWT's payload, not verified (the test only looks at what it says)."""
    parts = token.split(".")
    assert len(parts) == 3, token[:40]
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    return json.loads(base64.urlsafe_b64decode(payload))


def test_pod_reaches_the_api_through_the_kubernetes_service(cluster: tuple[FleetServer, str, str]) -> None:
    srv, ns, image = cluster
    cm = _root_ca_configmap(srv, ns)
    assert cm["data"] == {"ca.crt": _server_ca(srv)}
    assert cm["metadata"]["annotations"]["kubernetes.io/description"].startswith("Contains a CA bundle")
    # Deleted → published again by the controller.
    with srv.client() as c:
        assert c.delete(f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt").status_code == 200
    assert _root_ca_configmap(srv, ns)["data"] == {"ca.crt": _server_ca(srv)}

    pod = _create_pod(srv, ns, image, "plain", automountServiceAccountToken=False)
    assert (pod["spec"]["serviceAccountName"], pod["spec"]["serviceAccount"]) == ("default", "default")
    assert not pod["spec"].get("volumes")
    _running(srv, ns, "plain")
    with srv.client() as c:
        svc = c.get("/api/v1/namespaces/default/services/kubernetes").json()
    host, port = _exec(srv, ns, "plain", "echo $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT").split()
    assert (host, port) == (svc["spec"]["clusterIP"], "443")
    # The API server's TLS through the ClusterIP (the node's Service rules → the
    # advertised address): a handshake record (0x16, TLS 1.2 framing) comes back.
    assert _tls_answer_from_pod(srv, ns, "plain") == ["16", "03", "03"]
    assert not _exec(srv, ns, "plain", f"ls {SA_DIR} 2>/dev/null || true").strip()


def test_pod_gets_a_bound_service_account_token(cluster: tuple[FleetServer, str, str]) -> None:
    srv, ns, image = cluster
    _root_ca_configmap(srv, ns)
    created = _create_pod(srv, ns, image, "sa")
    (vol,) = created["spec"]["volumes"]
    assert vol["name"].startswith("kube-api-access-") and "projected" in vol
    assert created["spec"]["containers"][0]["volumeMounts"] == [
        {"name": vol["name"], "readOnly": True, "mountPath": SA_DIR}]
    pod = _running(srv, ns, "sa")
    assert _exec(srv, ns, "sa", f"ls {SA_DIR}").split() == ["ca.crt", "namespace", "token"]
    assert _exec(srv, ns, "sa", f"cat {SA_DIR}/namespace") == ns
    assert _exec(srv, ns, "sa", f"cat {SA_DIR}/ca.crt") == _server_ca(srv)
    token = _exec(srv, ns, "sa", f"cat {SA_DIR}/token")
    claims = _jwt_claims(token)
    assert claims["sub"] == f"system:serviceaccount:{ns}:default"
    aud = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    assert aud and all(isinstance(a, str) and a for a in aud)
    bound = claims["kubernetes.io"]
    assert bound["namespace"] == ns
    assert bound["pod"] == {"name": "sa", "uid": pod["metadata"]["uid"]}
    assert bound["serviceaccount"]["name"] == "default"
    assert claims["exp"] > claims["iat"]
    # On the node the volume is a tmpfs: the token never reaches the disk.
    host_dir = srv.data_dir / "agent" / "pods" / pod["metadata"]["uid"] / "volumes" / vol["name"]
    assert os.path.ismount(host_dir), host_dir
    assert (host_dir / "token").read_text() == token
    # Read-only; and the token authenticates as the pod's account (whatever RBAC then
    # says): asked from here, as the pod's busybox has no HTTPS client.
    assert "Read-only file system" in _exec(srv, ns, "sa", f"touch {SA_DIR}/x 2>&1 || true")
    assert _tls_answer_from_pod(srv, ns, "sa") == ["16", "03", "03"]
    with httpx.Client(base_url=srv.url, verify=srv.verify(), timeout=10) as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods/sa", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code in (200, 403), r.text
        if r.status_code == 403:
            assert f'User "system:serviceaccount:{ns}:default"' in r.json()["message"]
        r = c.get(f"/api/v1/namespaces/{ns}/pods/sa", headers={"Authorization": "Bearer x" + token[1:]})
        assert r.status_code == 401
    # The volume was set up at the first try.
    with srv.client() as c:
        events = c.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    assert not [e for e in events if e.get("reason") == "FailedMount"], events


def test_a_pods_token_works_as_its_account_until_the_account_is_deleted(
        cluster: tuple[FleetServer, str, str]) -> None:
    """The token a pod reads from its projected volume is its ServiceAccount to the API:
    exactly that account's rights (a view binding here), and nothing once the account
    is deleted (the token's bound ServiceAccount uid no longer exists)."""
    srv, ns, image = cluster
    _root_ca_configmap(srv, ns)
    for args in (("create", "serviceaccount", "robot"),
                 ("create", "rolebinding", "robot-view", "--clusterrole", "view", "--serviceaccount",
                  f"{ns}:robot")):
        rc, _, err = srv.kubectl("-n", ns, *args)
        assert rc == 0, err
    _create_pod(srv, ns, image, "robot", serviceAccountName="robot")
    _running(srv, ns, "robot")
    token = _exec(srv, ns, "robot", f"cat {SA_DIR}/token")
    assert _jwt_claims(token)["sub"] == f"system:serviceaccount:{ns}:robot"
    with httpx.Client(base_url=srv.url, verify=srv.verify(), timeout=10,
                      headers={"Authorization": f"Bearer {token}"}) as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods/robot")
        assert r.status_code == 200 and r.json()["metadata"]["name"] == "robot", r.text
        r = c.delete(f"/api/v1/namespaces/{ns}/pods/robot")
        assert r.status_code == 403, r.text
        assert r.json()["message"] == (f'pods "robot" is forbidden: User "system:serviceaccount:{ns}:robot" '
                                       f'cannot delete resource "pods" in API group "" in the namespace "{ns}"')
        rc, _, err = srv.kubectl("-n", ns, "delete", "serviceaccount", "robot")
        assert rc == 0, err
        r = c.get(f"/api/v1/namespaces/{ns}/pods/robot")
        assert r.status_code == 401 and r.json()["message"] == "Unauthorized", r.text
