"""Node join end to end: a machine in its own network namespace joins with only
`fleet agent --server URL --token <fleet token create>`.

One cluster for the module: machine 0 runs an agent with the admin kubeconfig (as
every multi-node test), machine 1 is idle until a test starts its agent as a
joining node.  The tests run in file order (the later ones use the joined node).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from fleet.agent.bootstrap import csr_object, key_pem, make_csr, new_key
from fleet.auth import bootstrap
from tests.conftest import _server_env
from tests.e2e.multinode import MultiNodeCluster, multinode_cluster, problem

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
JOINER = 1



@pytest.fixture(scope="module")
def cluster() -> Iterator[MultiNodeCluster]:
    why = problem()
    if why:
        pytest.skip(f"multi-node cluster: {why}")
    with tempfile.TemporaryDirectory(prefix="fleet-join-") as base, \
            multinode_cluster(Path(base), nodes=2, idle=[JOINER]) as c:
        yield c


def fleet(cluster: MultiNodeCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet.cli.main", *args, "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=timeout, env=_server_env())


def create_token(cluster: MultiNodeCluster, *args: str) -> str:
    p = fleet(cluster, "token", "create", *args)
    assert p.returncode == 0, p.stderr
    token = p.stdout.strip()
    assert bootstrap.parse_token(token), token
    return token


def ca_pem(cluster: MultiNodeCluster) -> bytes:
    """The server CA bundle (what signs serving certificates), as the kubeconfig has it."""
    cfg = yaml.safe_load(cluster.kubeconfig.read_text())
    return base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"])


def client_ca_pem(cluster: MultiNodeCluster) -> bytes:
    """The client CA (what signs client certificates), as the server publishes it."""
    code, cm = cluster.get(f"/api/v1/namespaces/{bootstrap.CLIENT_CA_NAMESPACE}/configmaps/"
                           f"{bootstrap.CLIENT_CA_NAME}")
    assert code == 200, cm
    return cm["data"][bootstrap.CLIENT_CA_KEY].encode()


def chains_to(cert_pem: bytes, ca: bytes) -> x509.Certificate:
    """The leaf of `cert_pem`, after checking the (first) CA's key signed it."""
    leaf = x509.load_pem_x509_certificates(cert_pem)[0]
    issuer = x509.load_pem_x509_certificates(ca)[0]
    assert leaf.issuer == issuer.subject
    pub = issuer.public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    pub.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm))
    return leaf


def wait_for(what: str, fn: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def csrs(cluster: MultiNodeCluster) -> list[dict[str, Any]]:
    code, body = cluster.get(CSRS)
    assert code == 200, body
    return body["items"]


def refused_agent(cluster: MultiNodeCluster, token: str) -> str:
    """Run a joining agent on the idle machine with `token`; it must exit 1 at once
    (before touching the machine); its output."""
    node = cluster.nodes[JOINER]
    with tempfile.TemporaryDirectory(prefix="fleet-join-refused-") as d:
        p = subprocess.run(["nsenter", f"--net={node.ns_path}", sys.executable, "-m", "fleet.cli.main", "agent",
                            "--server", cluster.server_url, "--token", token, "--data-dir", d,
                            "--node-name", "refused", "--driver", "oci", "--network", "none"],
                           capture_output=True, text=True, timeout=60, env=_server_env())
        assert p.returncode == 1, p.stdout + p.stderr
        assert not (Path(d) / "agent.json").exists()  # it stopped before anything
        assert not (Path(d) / "kubelet.kubeconfig").exists()
        return p.stderr


def bearer_status(cluster: MultiNodeCluster, token: str) -> int:
    import httpx

    with httpx.Client(base_url=cluster.server_url, verify=cluster.server.verify(),  # type: ignore[union-attr]
                      headers={"Authorization": f"Bearer {token}"}) as c:
        return c.get("/api/v1/namespaces/kube-public/configmaps/cluster-info").status_code


def test_deleted_and_expired_tokens_are_refused(cluster: MultiNodeCluster) -> None:
    revoked = create_token(cluster, "--description", "to be revoked")
    assert bearer_status(cluster, revoked) == 200  # cluster-info readable with the token
    p = fleet(cluster, "token", "delete", revoked.split(".")[0])
    assert p.returncode == 0 and f'bootstrap token "{revoked.split(".")[0]}" deleted' in p.stdout, p.stderr
    assert bearer_status(cluster, revoked) == 401
    assert "the server refused the bootstrap token" in refused_agent(cluster, revoked)
    # Expired: a Secret whose expiration has passed (the token cleaner deletes it soon).
    expired = bootstrap.generate_token()
    secret = bootstrap.token_secret(expired, ttl=dt.timedelta(seconds=1),
                                    now=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    cluster.post("/api/v1/namespaces/kube-system/secrets", secret)
    assert bearer_status(cluster, expired) == 401
    assert "the server refused the bootstrap token" in refused_agent(cluster, expired)
    name = secret["metadata"]["name"]
    wait_for("the token cleaner to delete the expired token",
             lambda: cluster.get(f"/api/v1/namespaces/kube-system/secrets/{name}")[0] == 404)


def test_a_machine_joins_with_a_token(cluster: MultiNodeCluster) -> None:
    token = create_token(cluster, "--description", "e2e join", "--ttl", "1h")
    listed = fleet(cluster, "token", "list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA", "GROUPS"]
    row = next(r for r in rows if r.startswith(token))
    assert "authentication,signing" in row and "e2e join" in row
    # cluster-info is signed for the token by the bootstrap signer.
    code, cm = cluster.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
    assert code == 200
    ca_hash = bootstrap.ca_cert_hash(ca_pem(cluster))
    node = cluster.start_node(JOINER, ["--server", cluster.server_url, "--token", token,
                                       "--ca-cert-hash", ca_hash])
    kubeconfig = node.data_dir / "kubelet.kubeconfig"
    wait_for("the joining agent's kubeconfig", kubeconfig.exists)
    assert kubeconfig.stat().st_mode & 0o077 == 0
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    leaf = chains_to(base64.b64decode(user["client-certificate-data"]), client_ca_pem(cluster))
    assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == f"system:node:{node.name}"
    assert [a.value for a in leaf.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)] == \
        ["system:nodes"]
    # The CSR: asked by the token's user, approved by csrapproving, issued by csrsigning.
    mine = [c for c in csrs(cluster) if c["spec"]["username"] == f"system:bootstrap:{token.split('.')[0]}"]
    assert len(mine) == 1
    assert "system:bootstrappers" in mine[0]["spec"]["groups"]
    conds = {c["type"]: c for c in mine[0]["status"]["conditions"]}
    assert conds["Approved"]["reason"] == "AutoApproved"
    rc, out, err = cluster.kubectl("get", "csr", mine[0]["metadata"]["name"])
    assert rc == 0, err
    assert out.split()[:6] == ["NAME", "AGE", "SIGNERNAME", "REQUESTOR", "REQUESTEDDURATION", "CONDITION"]
    assert "kubernetes.io/kube-apiserver-client-kubelet" in out and "Approved,Issued" in out


def test_the_joined_node_goes_ready_and_runs_a_pod(cluster: MultiNodeCluster) -> None:
    # From now on the node is system:node:<name> (its client certificate): it registers,
    # goes Ready and runs pods.
    node = cluster.nodes[JOINER]
    cluster.wait_node_ready(node, timeout=90)
    ns = cluster.create_namespace()
    cluster.create_pod(ns, cluster.pod("joined", node, ["sleep", "3600"]))
    cluster.wait_pod_ready(ns, "joined")
    # As itself, the node obtains a serving certificate for its agent API.
    serving = wait_for("the node's kubelet-serving certificate",
                       lambda: [c for c in csrs(cluster) if c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
                                and c["spec"]["username"] == f"system:node:{node.name}"
                                and (c.get("status") or {}).get("certificate")])
    assert serving[0]["status"]["conditions"][0]["reason"] == "AutoApproved"
    leaf = chains_to(wait_for("kubelet-serving.crt", lambda: (node.data_dir / "kubelet-serving.crt").exists()
                              and (node.data_dir / "kubelet-serving.crt").read_bytes()), ca_pem(cluster))
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert node.address in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    # And its storage provisioner's certificate (test_the_joined_nodes_provisioner_...).
    wait_for("storage-provisioner.kubeconfig", (node.data_dir / "storage-provisioner.kubeconfig").exists)


def test_a_restarted_joined_agent_needs_no_token(cluster: MultiNodeCluster) -> None:
    node = cluster.nodes[JOINER]
    before = (node.data_dir / "kubelet.kubeconfig").read_bytes()
    count = len(csrs(cluster))
    node.stop()
    since = len(node.output(tail=200_000_000))
    cluster.start_node(JOINER, ["--server", cluster.server_url])
    cluster.wait_node_ready(node, timeout=90, since=since)
    assert (node.data_dir / "kubelet.kubeconfig").read_bytes() == before
    assert len(csrs(cluster)) == count  # no new CSR


def test_a_node_cannot_get_another_nodes_certificate(cluster: MultiNodeCluster) -> None:
    node = cluster.nodes[JOINER]
    other = cluster.nodes[0].name
    manifest = csr_object(make_csr(new_key(), f"system:node:{other}", ["system:nodes"]),
                          "kubernetes.io/kube-apiserver-client-kubelet", ["digital signature", "client auth"],
                          name="steal-" + other)
    kubeconfig = node.data_dir / "kubelet.kubeconfig"
    rc, out, err = cluster.kubectl("--kubeconfig", str(kubeconfig), "create", "-f", "-",
                                   input=json.dumps(manifest))
    assert rc == 0, err

    def denied() -> dict[str, Any] | None:
        code, obj = cluster.get(f"{CSRS}/steal-{other}")
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        return conds.get("Denied")

    cond = wait_for("the CSR for another node's name to be denied", denied, timeout=30)
    assert cond["reason"] == "AutoDenied"
    code, obj = cluster.get(f"{CSRS}/steal-{other}")
    assert obj["spec"]["username"] == f"system:node:{node.name}"
    assert not (obj.get("status") or {}).get("certificate")


def test_a_node_reads_only_what_its_own_pods_use(cluster: MultiNodeCluster) -> None:
    """The Node authorizer: with the joined node's certificate, a Secret used by its own
    pod is readable; one used only by another node's pod is 403, in Kubernetes' words."""
    node, other = cluster.nodes[JOINER], cluster.nodes[0]
    ns = cluster.create_namespace()
    for name in ("mine", "theirs"):
        cluster.post(f"/api/v1/namespaces/{ns}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"k": name}})
    for name, on in (("mine", node), ("theirs", other)):
        pod = cluster.pod(f"uses-{name}", on, ["sleep", "3600"])
        pod["spec"]["volumes"] = [{"name": "s", "secret": {"secretName": name}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/s"}]
        cluster.create_pod(ns, pod)
    cluster.wait_pod_ready(ns, "uses-mine")  # its agent read "mine" as the node
    kubeconfig = str(node.data_dir / "kubelet.kubeconfig")
    rc, out, err = cluster.kubectl("--kubeconfig", kubeconfig, "-n", ns, "get", "secret", "mine", "-o", "name")
    assert (rc, out.strip()) == (0, "secret/mine"), err
    rc, _, err = cluster.kubectl("--kubeconfig", kubeconfig, "-n", ns, "get", "secret", "theirs")
    assert rc == 1, err
    assert (f'secrets "theirs" is forbidden: User "system:node:{node.name}" cannot get resource "secrets" '
            f'in API group "" in the namespace "{ns}": no relationship found between node '
            f"'{node.name}' and this object") in err, err
    rc, _, err = cluster.kubectl("--kubeconfig", kubeconfig, "-n", ns, "get", "secrets")
    assert rc == 1 and 'cannot list resource "secrets"' in err, err
    # Nor may it touch the other node's objects.
    rc, _, err = cluster.kubectl("--kubeconfig", kubeconfig, "label", "node", other.name, "stolen=yes")
    assert rc == 1 and "forbidden" in err.lower(), err
    # Its agent API serves with its kubelet-serving certificate: logs through the server.
    rc, out, err = cluster.kubectl("-n", ns, "exec", "uses-mine", "--", "cat", "/s/k")
    assert (rc, out) == (0, "mine"), err


def test_the_joined_nodes_provisioner_has_its_own_identity(cluster: MultiNodeCluster) -> None:
    """A joined node's node-local storage provisioner cannot be the node (NodeRestriction
    keeps nodes off claims and volumes): it asks, as the node, for a certificate of its
    own, and provisions a WaitForFirstConsumer claim for a pod scheduled there."""
    node = cluster.nodes[JOINER]
    mine = wait_for("the provisioner's certificate", lambda: [
        c for c in csrs(cluster) if c["spec"]["username"] == f"system:node:{node.name}"
        and c["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client"
        and (c.get("status") or {}).get("certificate")])
    assert mine[0]["status"]["conditions"][0]["reason"] == "AutoApproved"
    kubeconfig = node.data_dir / "storage-provisioner.kubeconfig"
    assert kubeconfig.exists() and kubeconfig.stat().st_mode & 0o077 == 0
    rc, out, err = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json")
    assert rc == 0, err
    info = json.loads(out)["status"]["userInfo"]
    assert info["username"] == f"system:fleet:storage-provisioner:{node.name}"
    assert "system:fleet:storage-provisioners" in info["groups"]
    ns = cluster.create_namespace()
    cluster.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                 "resources": {"requests": {"storage": "16Mi"}}}})
    pod = cluster.pod("writer", node, ["sh", "-c", "echo kept > /data/f; sleep 3600"])
    del pod["spec"]["nodeName"]  # scheduled, so the claim gets its selected node
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    pod["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/data"}]
    cluster.create_pod(ns, pod)
    cluster.wait_pod_ready(ns, "writer", timeout=90)
    code, pvc = cluster.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data")
    assert pvc["status"]["phase"] == "Bound", pvc
    code, pv = cluster.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert node.name in json.dumps(terms)
    rc, out, err = cluster.kubectl("-n", ns, "exec", "writer", "--", "cat", "/data/f")
    assert (rc, out) == (0, "kept\n"), err
    rc, _, err = cluster.kubectl("-n", ns, "delete", "pod", "writer", "--grace-period=1")
    assert rc == 0, err


def test_kubectl_certificate_approve_issues_a_client_certificate(cluster: MultiNodeCluster) -> None:
    key = new_key()
    manifest = csr_object(make_csr(key, "jane", ["dev"]), "kubernetes.io/kube-apiserver-client",
                          ["digital signature", "client auth"], name="jane")
    cluster.post(CSRS, manifest)
    time.sleep(2)  # the approver leaves it alone: only a person approves this one
    code, obj = cluster.get(f"{CSRS}/jane")
    assert not (obj.get("status") or {}).get("conditions"), obj
    rc, out, err = cluster.kubectl("certificate", "approve", "jane")
    assert rc == 0, err
    assert "certificatesigningrequest.certificates.k8s.io/jane approved" in out

    def issued() -> bytes | None:
        _, o = cluster.get(f"{CSRS}/jane")
        cert = (o.get("status") or {}).get("certificate")
        return base64.b64decode(cert) if cert else None

    cert = wait_for("jane's certificate", issued, timeout=30)
    leaf = chains_to(cert, client_ca_pem(cluster))
    assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "jane"
    # jane authenticates with it: `kubectl auth whoami` with her certificate alone.
    with tempfile.TemporaryDirectory(prefix="fleet-jane-") as d:
        cfg = yaml.safe_load(cluster.kubeconfig.read_text())
        cfg["users"][0]["user"] = {"client-certificate-data": base64.b64encode(cert).decode(),
                                   "client-key-data": base64.b64encode(key_pem(key)).decode()}
        kcfg = Path(d) / "jane.kubeconfig"
        kcfg.write_text(yaml.safe_dump(cfg))
        rc, out, err = cluster.kubectl("--kubeconfig", str(kcfg), "auth", "whoami", "-o", "json")
        assert rc == 0, err
        info = json.loads(out)["status"]["userInfo"]
        assert (info["username"], info["groups"]) == ("jane", ["dev", "system:authenticated"])
    # Denying: kubectl certificate deny on a fresh request.
    cluster.post(CSRS, csr_object(make_csr(new_key(), "joe", ["dev"]), "kubernetes.io/kube-apiserver-client",
                                  ["client auth"], name="joe"))
    rc, out, err = cluster.kubectl("certificate", "deny", "joe")
    assert rc == 0 and "denied" in out, err
    rc, out, err = cluster.kubectl("get", "csr", "joe")
    assert "Denied" in out
