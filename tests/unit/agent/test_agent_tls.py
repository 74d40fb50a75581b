"""fleet/agent/tls.py: who may call the agent API, and its serving certificate renewal."""

from __future__ import annotations

import datetime as dt
import os
import ssl
from pathlib import Path

import pytest

from fleet.agent.tls import AgentTLS, FileSource, authorize_request, decide
from fleet.auth import UserInfo
from fleet.auth.certrotation import PKIServingSource
from fleet.auth.pki import ClusterPKI, load_pem_chain


@pytest.fixture
def pki(tmp_path: Path) -> ClusterPKI:
    p = ClusterPKI(tmp_path / "server", leaf_lifetime=dt.timedelta(hours=3))
    p.ensure([])
    return p


def der(chain_pem: bytes) -> tuple[bytes, ...]:
    return tuple(ssl.PEM_cert_to_DER_cert(c.decode()) for c in
                 [b"-----BEGIN CERTIFICATE-----" + part for part in
                  chain_pem.split(b"-----BEGIN CERTIFICATE-----")[1:]])


@pytest.mark.parametrize("user,token_ok,want", [
    (UserInfo("fleet-apiserver-kubelet-client", groups=("system:masters",)), False, 0),
    (UserInfo("system:node:n2", groups=("system:nodes",)), True, 403),
    (None, True, 0),
    (None, False, 401),
])
def test_decide(user: UserInfo | None, token_ok: bool, want: int) -> None:
    assert decide(user, token_ok) == want


def test_authorize_request_with_certificates(tmp_path: Path, pki: ClusterPKI) -> None:
    tls = AgentTLS(PKIServingSource(pki, "n1"), tmp_path / "agent")
    tls.start(["127.0.0.1", "n1"])
    server = der(pki.issue_client_cert("fleet-apiserver-kubelet-client", ["system:masters"])[0])
    node = der(pki.issue_client_cert("system:node:n2", ["system:nodes"])[0])
    assert authorize_request(tls, server, lambda: False) == 0
    assert authorize_request(tls, node, lambda: True) == 403  # a valid cert is not a token
    # Another cluster's certificate, however named: 401 even with a good token.
    other = ClusterPKI(tmp_path / "other")
    other.ensure([])
    foreign = der(other.issue_client_cert("fleet-apiserver-kubelet-client", ["system:masters"])[0])
    assert authorize_request(tls, foreign, lambda: True) == 401
    assert authorize_request(tls, (), lambda: False) == 401
    assert authorize_request(tls, (), lambda: True) == 0
    assert authorize_request(None, (), lambda: False) == 401


def test_serving_certificate_from_the_server_ca_and_renewed(tmp_path: Path, pki: ClusterPKI) -> None:
    tls = AgentTLS(PKIServingSource(pki, "n1"), tmp_path / "agent")
    cfg = tls.start(["10.0.0.9", "n1"])
    assert cfg.certfile == str(tls.cert_file)
    cert = tls.cert
    assert cert is not None
    cert.verify_directly_issued_by(pki.ca("server").cert)
    assert "system:node:n1" in cert.subject.rfc4514_string()
    now = dt.datetime.now(dt.UTC)
    assert tls.check(now) is False
    assert tls.check(now + dt.timedelta(hours=2, minutes=1)) is True
    assert tls.cert is not None and tls.cert.serial_number != cert.serial_number
    # After a server CA rotation the certificate is re-issued by the new CA.
    pki.rotate("server")
    assert tls.check() is True
    assert load_pem_chain(tls.cert_file.read_bytes())[0].issuer == pki.ca("server").cert.subject


def test_file_source_reloads_changed_files(tmp_path: Path, pki: ClusterPKI) -> None:
    cert, key = pki.issue_serving_cert(["n1"], "system:node:n1")
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(pki.client_ca_bundle_pem())
    tls = AgentTLS(FileSource(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"), str(tmp_path / "ca.pem")),
                   tmp_path / "agent")
    tls.start(["n1"])
    assert tls.check() is False
    cert2, key2 = pki.issue_serving_cert(["n1"], "system:node:n1")
    (tmp_path / "c.pem").write_bytes(cert2)
    (tmp_path / "k.pem").write_bytes(key2)
    os.utime(tmp_path / "c.pem", (1, 1))
    assert tls.check() is True
    assert tls.cert == load_pem_chain(cert2)[0]
