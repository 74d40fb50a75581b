"""Registry mirrors end to end: a real `fleet agent --registries FILE` (oci driver, runc)
pulls pod images through docker-registry mirrors on loopback, with the upstream
registries unreachable.

The internet is never contacted: the agent runs with HTTP(S)_PROXY pointing at a
closed loopback port and NO_PROXY for loopback, so every non-loopback registry —
`registry-1.docker.io` included — fails to connect at once (a stand-in for an
air-gapped site), while the mirrors on 127.0.0.1 are reached directly.  The
registries file lists, for docker.io, a dead mirror first and the live one second
(order and fall-back), a rewrite for one organisation, and an htpasswd-protected
mirror for a private registry with its credentials under `configs`.  Each mirror
logs the requests it served, so the test asserts that the mirror served the
manifest.  The last tests (no agent) pull from an HTTPS mirror whose certificate
only the `configs.<host>.tls.ca_file` CA vouches for, and from one that demands
a client certificate (`cert_file`/`key_file`).  Registries are stopped by pid and their directories removed; the agent's
containers are removed as in test_agent.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.auth.pki import ensure_serving_tls
from fleet.runtime.images import ImagePullError, ImageStore, load_registries, pull
from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, push
from tests.conftest import FleetServer, _server_env, create_namespace, free_port
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import delete_pods_and_wait_clean, finish
from tests.e2e.test_agent import Agent, create, get, pod_status
from tests.e2e.test_image_registry import REGISTRY_BIN, Registry, _htpasswd_line

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(REGISTRY_BIN is None, reason="needs docker-registry"),
]
# The pod tests run a real agent with the oci driver.
needs_agent = pytest.mark.skipif(os.geteuid() != 0 or find_runtime() is None,
                                 reason="needs root and runc or crun (the oci driver)")

USER, PASSWORD = "mirror-user", "mirror-pw"


class MirrorAgent(Agent):
    """`fleet agent` with a registries file and no route to any non-loopback registry."""

    def __init__(self, srv: FleetServer, base: Path, name: str, registries: Path) -> None:
        super().__init__(srv, base, name)
        self.registries = registries
        self.dead_proxy = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    def start(self) -> None:
        argv = [sys.executable, "-m", "fleet.cli.main", "agent", "--kubeconfig",
                str(self.srv.kubeconfig), "--data-dir", str(self.data_dir),
                "--node-name", self.node, "--port", str(self.port), "--driver", "oci",
                "--network", "none", "--address", "127.0.0.1",
                "--registries", str(self.registries)]
        env = _server_env()
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                  "all_proxy"):
            env[k] = self.dead_proxy
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)


def _start_registry(base: Path, htpasswd: str | None = None) -> Registry:
    d = Path(tempfile.mkdtemp(prefix="fleet-mirror-", dir=base))
    return Registry(d, free_port(), log_level="info").start(htpasswd)


def _served(reg: Registry, path: str) -> bool:
    """Whether the registry's request log shows a GET of `path` answered 200."""
    log = (reg.base / "registry.log").read_text(errors="replace")
    return any(path in line and "http.response.status=200" in line and "GET" in line
               for line in log.splitlines())


@pytest.fixture
def mirrored(fleet_server_factory: Any) -> Iterator[dict[str, Any]]:
    srv = fleet_server_factory.start()
    base = srv.data_dir.parent
    plain = _start_registry(base)
    private = _start_registry(base, _htpasswd_line(USER, PASSWORD))
    agent: MirrorAgent | None = None
    try:
        busybox = build_busybox_image(cmd=["sh", "-c", "echo default cmd"])

        async def load() -> None:
            await push(busybox, plain.url, "library/busybox", "latest")
            await push(busybox, plain.url, "mirrored/tools/busybox", "v1")
            await push(busybox, private.url, "team/busybox", "v2", auth=(USER, PASSWORD))

        trio.run(load)
        registries = base / "registries.yaml"
        registries.write_text(
            "mirrors:\n"
            "  docker.io:\n"
            "    endpoint:\n"
            f"      - http://127.0.0.1:{free_port()}\n"  # down: the next one serves
            f"      - {plain.url}\n"
            "    rewrite:\n"
            '      "^tools/(.*)": "mirrored/tools/$1"\n'
            "  private.example.com:\n"
            f"    endpoint: [{private.url}]\n"
            "configs:\n"
            f"  {private.host}:\n"
            f"    auth: {{username: {USER}, password: {PASSWORD}}}\n")
        agent = MirrorAgent(srv, base, f"mirror-{uuid.uuid4().hex[:6]}", registries)
        ns = f"mirrors-{uuid.uuid4().hex[:6]}"
        create_namespace(srv, ns)
        agent.start()
        yield {"srv": srv, "agent": agent, "ns": ns, "plain": plain, "private": private}
    finally:
        leaked: list[str] = []
        try:
            if agent is not None:
                if agent.proc is not None and agent.proc.poll() is None:
                    # The agent must remove everything of the deleted pods by itself.
                    leaked = delete_pods_and_wait_clean(srv, agent.data_dir, ns)
        finally:
            try:
                if agent is not None:
                    agent.stop()
                    # Cleans up a leak through the killall machinery, and fails on it.
                    finish(agent.data_dir, leaked, agent.output())
                    shutil.rmtree(agent.data_dir, ignore_errors=True)
            finally:
                plain.stop()
                private.stop()
                shutil.rmtree(plain.base, ignore_errors=True)
                shutil.rmtree(private.base, ignore_errors=True)


def _pod(name: str, node: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image,
                                     "command": ["sh", "-c", "echo pulled through a mirror"]}]}}


def _succeeded(m: dict[str, Any], name: str) -> dict[str, Any]:
    srv, agent, ns = m["srv"], m["agent"], m["ns"]

    def done() -> dict[str, Any] | None:
        st = pod_status(srv, ns, name)
        assert st.get("phase") != "Failed", st
        return st if st.get("phase") == "Succeeded" else None

    try:
        return wait_until(done, timeout=90, what=f"pod {name} Succeeded")
    except AssertionError:
        sys.stderr.write(f"\n----- agent output -----\n{agent.output()}\n")
        raise


@needs_agent
def test_busybox_pulls_through_the_mirror_with_docker_hub_unreachable(mirrored):
    srv, agent, ns, plain = mirrored["srv"], mirrored["agent"], mirrored["ns"], mirrored["plain"]
    create(srv, ns, _pod("hub", agent.node, "busybox"))
    st = _succeeded(mirrored, "hub")
    cs = st["containerStatuses"][0]
    assert cs["state"]["terminated"]["exitCode"] == 0
    assert cs["image"] in ("busybox", "docker.io/library/busybox:latest")
    # The live mirror (second in the list) served the manifest and the blobs.
    assert _served(plain, "/v2/library/busybox/manifests/latest")
    assert _served(plain, "/v2/library/busybox/blobs/sha256:")
    # The image is recorded under its own name, as if it came from Docker Hub.
    code, events = get(srv, f"/api/v1/namespaces/{ns}/events")
    assert code == 200
    pulled = [e["message"] for e in events["items"] if e.get("reason") == "Pulled"]
    assert any('Successfully pulled image "busybox"' in m for m in pulled), pulled


@needs_agent
def test_rewrite_and_private_mirror_credentials(mirrored):
    srv, agent, ns = mirrored["srv"], mirrored["agent"], mirrored["ns"]
    plain, private = mirrored["plain"], mirrored["private"]
    create(srv, ns, _pod("rewritten", agent.node, "tools/busybox:v1"))
    create(srv, ns, _pod("private", agent.node, "private.example.com/team/busybox:v2"))
    _succeeded(mirrored, "rewritten")
    _succeeded(mirrored, "private")
    # docker.io/tools/busybox was fetched as mirrored/tools/busybox from the mirror.
    assert _served(plain, "/v2/mirrored/tools/busybox/manifests/v1")
    # The htpasswd mirror was answered with the credentials from configs.
    assert _served(private, "/v2/team/busybox/manifests/v2")


@needs_agent
def test_image_on_no_mirror_reports_every_endpoint(mirrored):
    srv, agent, ns = mirrored["srv"], mirrored["agent"], mirrored["ns"]
    create(srv, ns, _pod("missing", agent.node, "busybox:not-mirrored"))

    def failed() -> str | None:
        st = pod_status(srv, ns, "missing")
        for cs in st.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                return str(waiting.get("message") or "")
        return None

    message = wait_until(failed, timeout=60, what="ErrImagePull")
    # Both mirrors were tried in order, then Docker Hub itself, which is unreachable here.
    assert "every endpoint failed" in message, message
    assert "manifest unknown" in message, message
    assert "registry registry-1.docker.io unreachable" in message, message


@pytest.fixture
def tls_mirror(tmp_path: Path) -> Iterator[tuple[Registry, Path]]:
    """A docker-registry serving HTTPS with a certificate from a fresh CA (for 127.0.0.1),
    holding busybox as library/busybox:tls (pushed over HTTP before TLS is turned on)."""
    pki = ensure_serving_tls(tmp_path / "pki")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.ca_cert_pem)
    base = Path(tempfile.mkdtemp(prefix="fleet-mirror-tls-"))
    port = free_port()
    reg = Registry(base, port).start()
    try:
        trio.run(push, build_busybox_image(), reg.url, "library/busybox", "tls")
    finally:
        reg.stop()
    tls = Registry(base, port, tls=(pki.cert_file, pki.key_file))
    try:
        yield tls.start(), ca
    finally:
        tls.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_https_mirror_trusted_by_ca_file(tls_mirror, tmp_path):
    reg, ca = tls_mirror
    # The registry itself is switched off: a failure must not go looking on the internet.

    def registries(tls: str) -> Any:
        f = tmp_path / "registries.yaml"
        f.write_text(f"mirrors:\n  docker.io:\n    endpoint: [{reg.url}]\n"
                     + (f"configs:\n  {reg.host}:\n    tls: {tls}\n" if tls else ""))
        return load_registries(f, disable_default_endpoint=True)

    async def attempt(tls: str) -> str:
        store = ImageStore(tmp_path / f"images-{uuid.uuid4().hex[:6]}")
        try:
            rec = await pull(store, "busybox:tls", registries=registries(tls))
        except ImagePullError as e:
            return e.message
        return rec.ref

    # No CA: the certificate is refused (and nothing else is tried).
    refused = trio.run(attempt, "")
    assert "CERTIFICATE_VERIFY_FAILED" in refused and f"mirror {reg.url}/v2" in refused, refused
    assert f'configs."{reg.host}".tls.ca_file' in refused, refused  # says what to do
    assert trio.run(attempt, f"{{ca_file: {ca}}}") == "docker.io/library/busybox:tls"
    assert trio.run(attempt, "{insecure_skip_verify: true}") == "docker.io/library/busybox:tls"


def _client_cert(pki_dir: Path, out: Path) -> tuple[Path, Path]:
    """A client certificate (clientAuth) signed by the CA that ensure_serving_tls made."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((pki_dir / "tls" / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "tls" / "ca.key").read_bytes(),
                                                password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-node")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_file, key_file = out / "client.pem", out / "client-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_https_mirror_demanding_a_client_certificate(tmp_path):
    pki = ensure_serving_tls(tmp_path / "pki")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.ca_cert_pem)
    cert, key = _client_cert(tmp_path / "pki", tmp_path)
    base = Path(tempfile.mkdtemp(prefix="fleet-mirror-mtls-"))
    port = free_port()
    reg = Registry(base, port).start()
    try:
        trio.run(push, build_busybox_image(), reg.url, "library/busybox", "mtls")
    finally:
        reg.stop()
    mtls = Registry(base, port, tls=(pki.cert_file, pki.key_file), client_auth=(ca, cert, key))
    try:
        mtls.start()

        async def attempt(tls: str) -> str:
            f = tmp_path / "registries.yaml"
            f.write_text(f"mirrors:\n  docker.io:\n    endpoint: [{mtls.url}]\n"
                         f"configs:\n  {mtls.host}:\n    tls: {tls}\n")
            store = ImageStore(tmp_path / f"images-{uuid.uuid4().hex[:6]}")
            try:
                rec = await pull(store, "busybox:mtls",
                                 registries=load_registries(f, disable_default_endpoint=True))
            except ImagePullError as e:
                return e.message
            return rec.ref

        without = trio.run(attempt, f"{{ca_file: {ca}}}")
        # The registry refuses the handshake; the message carries the TLS alert.
        assert f"mirror {mtls.url}/v2 unreachable" in without, without
        assert "BAD_CERTIFICATE" in without.upper(), without
        assert trio.run(attempt, f"{{ca_file: {ca}, cert_file: {cert}, key_file: {key}}}") \
            == "docker.io/library/busybox:mtls"
    finally:
        mtls.stop()
        shutil.rmtree(base, ignore_errors=True)
