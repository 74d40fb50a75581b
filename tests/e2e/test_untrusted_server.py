"""A server that cannot be verified, or reached, is named as the cause (not an empty message).

The kubeconfig's CA is swapped for one that never signed the server's
certificate: `kfleet get pods` must print the TLS verification failure and a
hint, and `fleet agent --simulate 1` must log it while it retries; against a
closed port both must say the connection was refused.
"""

from __future__ import annotations

import base64
import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import REPO_ROOT, FleetServer, _server_env, free_port


def other_ca_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not-the-fleet-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def kubeconfig_with(srv: FleetServer, tmp: Path, *, ca: bytes | None = None, server: str | None = None) -> Path:
    cfg = yaml.safe_load(srv.kubeconfig.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    if server is not None:
        cluster["server"] = server
    out = tmp / "kubeconfig"
    out.write_text(yaml.safe_dump(cfg))
    return out


def kfleet(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = _server_env()
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO_ROOT))


def agent_output(kubeconfig: Path, tmp: Path, seconds: float = 6.0) -> str:
    log = tmp / "agent.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "fleet.cli.main", "agent", "--kubeconfig", str(kubeconfig),
                                 "--simulate", "1", "--data-dir", str(tmp / "agent"), "--port", str(free_port())],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env(),
                                start_new_session=True)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            if "failed" in log.read_text(errors="replace"):
                time.sleep(0.5)
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return log.read_text(errors="replace")


def test_wrong_ca_is_named(fleet_server: FleetServer, tmp_path: Path) -> None:
    kc = kubeconfig_with(fleet_server, tmp_path, ca=other_ca_pem())
    p = kfleet(kc, "get", "pods")
    assert p.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in p.stderr and "certificate-authority" in p.stderr, p.stderr
    out = agent_output(kc, tmp_path)
    assert "CERTIFICATE_VERIFY_FAILED" in out and "failed: \n" not in out, out[-3000:]


def test_closed_port_is_named(fleet_server: FleetServer, tmp_path: Path) -> None:
    kc = kubeconfig_with(fleet_server, tmp_path, server=f"https://127.0.0.1:{free_port()}")
    p = kfleet(kc, "get", "pods")
    assert p.returncode == 1 and "Unable to connect" in p.stderr and "Connection refused" in p.stderr, p.stderr
    out = agent_output(kc, tmp_path)
    assert "registering node" in out and "failed: \n" not in out, out[-3000:]
    assert "ConnectError" in out, out[-3000:]
