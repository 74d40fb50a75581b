"""fleet/auth/pki.py: the CAs, leaves, CSR signing, bundles across a rotation, renewal."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleet.auth.pki import (
    SIGNER_CLIENT,
    SIGNER_KUBELET_CLIENT,
    SIGNER_KUBELET_SERVING,
    ClusterPKI,
    CSRError,
    cert_status,
    ensure_serving_tls,
    load_pem_chain,
    needs_renewal,
    renewal_due,
)
from fleet.auth.x509 import verify_client_chain

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def csr_pem(cn: str, orgs: tuple[str, ...] = (), *, sans: list[x509.GeneralName] | None = None,
            key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    b = x509.CertificateSigningRequestBuilder().subject_name(name)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


@pytest.fixture
def pki(tmp_path: Path) -> ClusterPKI:
    p = ClusterPKI(tmp_path)
    p.ensure(["10.0.0.5", "node-a.example"])
    return p


def test_three_distinct_cas_created_once_private_and_kept(tmp_path: Path, pki: ClusterPKI) -> None:
    subjects = {pki.ca(n).cert.subject for n in ("server", "client", "requestheader")}
    assert len(subjects) == 3
    for n in ("server", "client", "requestheader"):
        c = pki.ca(n).cert
        assert c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert isinstance(c.public_key(), ec.EllipticCurvePublicKey)
        assert c.public_key().curve.name == "secp256r1"
    for key in (tmp_path / "tls").glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    again = ClusterPKI(tmp_path)
    again.ensure(["10.0.0.5", "node-a.example"])
    assert again.ca("server").cert == pki.ca("server").cert
    assert again.ca("client").cert == pki.ca("client").cert


def test_serving_cert_sans_and_reissued_for_new_names(tmp_path: Path, pki: ClusterPKI) -> None:
    cert = load_pem_chain(pki.serving_cert_file.read_bytes())[0]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.0.0.5") in sans.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert {"localhost", "node-a.example"} <= set(sans.get_values_for_type(x509.DNSName))
    assert eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # Same names: kept; other names: re-issued.
    same = ClusterPKI(tmp_path)
    same.ensure(["10.0.0.5", "node-a.example"])
    assert load_pem_chain(same.serving_cert_file.read_bytes())[0].serial_number == cert.serial_number
    p2 = ClusterPKI(tmp_path)
    p2.ensure(["10.9.9.9"])
    cert2 = load_pem_chain(p2.serving_cert_file.read_bytes())[0]
    assert cert2.serial_number != cert.serial_number
    ips = cert2.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.9.9.9") in ips.get_values_for_type(x509.IPAddress)
    # It verifies with Python's ssl against the server CA bundle for that address.
    ctx = ssl.create_default_context(cadata=p2.server_ca_bundle_pem().decode())
    assert ctx.verify_mode == ssl.CERT_REQUIRED


def test_admin_certificate_is_system_masters_from_the_client_ca(pki: ClusterPKI) -> None:
    chain, key = pki.leaf_pem("admin")
    cert = load_pem_chain(chain)[0]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:admin"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == \
        ["system:masters"]
    assert cert.issuer == pki.ca("client").cert.subject
    assert eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    serialization.load_pem_private_key(key, None)


def test_ensure_serving_tls_compat(tmp_path: Path) -> None:
    tls = ensure_serving_tls(tmp_path, ["10.1.2.3"])
    assert tls.cert_file.exists() and tls.key_file.exists()
    assert (tmp_path / "tls" / "ca.crt").read_bytes() in tls.ca_cert_pem


@pytest.mark.parametrize("signer,usages,ca,want", [
    (SIGNER_CLIENT, ["client auth", "digital signature"], "client", ExtendedKeyUsageOID.CLIENT_AUTH),
    (SIGNER_KUBELET_CLIENT, ["client auth", "digital signature", "key encipherment"], "client",
     ExtendedKeyUsageOID.CLIENT_AUTH),
    (SIGNER_KUBELET_SERVING, ["server auth", "digital signature", "key encipherment"], "server",
     ExtendedKeyUsageOID.SERVER_AUTH),
])
def test_sign_csr_per_signer(pki: ClusterPKI, signer: str, usages: list[str], ca: str,
                             want: x509.ObjectIdentifier) -> None:
    sans = [x509.DNSName("node-a"), x509.IPAddress(ipaddress.ip_address("10.0.0.7"))]
    pem = pki.sign_csr(csr_pem("system:node:node-a", ("system:nodes",), sans=sans), signer=signer,
                       usages=usages, ttl=dt.timedelta(hours=1))
    cert = load_pem_chain(pem)[0]
    cert.verify_directly_issued_by(pki.ca(ca).cert)
    assert eku(cert) == [want]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node-a"
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(hours=1) <= life <= dt.timedelta(hours=1, minutes=6)
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and ku.key_encipherment == ("key encipherment" in usages)
    has_sans = True
    try:
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        has_sans = False
    assert has_sans == (signer == SIGNER_KUBELET_SERVING)  # client certificates carry no names


def test_sign_csr_refuses_a_bad_signature(pki: ClusterPKI) -> None:
    good = x509.load_pem_x509_csr(csr_pem("mallory"))
    der = bytearray(good.public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0xFF  # inside the signature
    bad = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CSRError, match="signature"):
        pki.sign_csr(bad, signer=SIGNER_CLIENT, usages=["client auth"], ttl=dt.timedelta(hours=1))


@pytest.mark.parametrize("signer,usages", [
    (SIGNER_CLIENT, ["server auth"]),
    (SIGNER_KUBELET_SERVING, ["client auth"]),
    (SIGNER_CLIENT, ["digital signature"]),
    ("example.com/other", ["client auth"]),
])
def test_sign_csr_refuses_usages_the_signer_does_not_give(pki: ClusterPKI, signer: str,
                                                          usages: list[str]) -> None:
    with pytest.raises(CSRError):
        pki.sign_csr(csr_pem("x"), signer=signer, usages=usages, ttl=dt.timedelta(hours=1))


def test_rotation_keeps_the_old_ca_in_the_bundles_then_drops_it(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path, leaf_lifetime=dt.timedelta(hours=1))
    pki.ensure([])
    old_server, old_client = pki.ca("server").cert, pki.ca("client").cert
    old_admin = load_pem_chain(pki.leaf_pem("admin")[0])[0]
    now = dt.datetime.now(dt.UTC)
    assert pki.rotate("all", overlap=dt.timedelta(hours=2), now=now) == \
        ["server", "client", "requestheader"]
    new_server, new_client = pki.ca("server").cert, pki.ca("client").cert
    assert new_server != old_server and new_client != old_client
    server_bundle = load_pem_chain(pki.server_ca_bundle_pem())
    client_bundle = load_pem_chain(pki.client_ca_bundle_pem())
    assert server_bundle == [new_server, old_server]
    assert client_bundle == [new_client, old_client]
    # Leaves re-issued by the new CAs, with the cross certificate after them.
    admin_chain = load_pem_chain(pki.leaf_pem("admin")[0])
    admin_chain[0].verify_directly_issued_by(new_client)
    cross = admin_chain[1]
    assert cross.subject == new_client.subject and cross.issuer == old_client.subject
    cross.verify_directly_issued_by(old_client)
    # A peer that trusts only the old client CA still verifies the new admin cert
    # through the cross certificate; the old admin cert still verifies too.
    verify_client_chain(admin_chain, [old_client], now)
    verify_client_chain([old_admin], client_bundle, now)
    serving_chain = load_pem_chain(pki.serving_cert_file.read_bytes())
    serving_chain[0].verify_directly_issued_by(new_server)
    serving_chain[1].verify_directly_issued_by(old_server)
    # Another process (the server) sees the same state.
    other = ClusterPKI(tmp_path)
    other.load(now)
    assert load_pem_chain(other.server_ca_bundle_pem()) == [new_server, old_server]
    # After the overlap the old CA and the cross certificate are gone.
    later = now + dt.timedelta(hours=3)
    other.refresh(now=later)
    assert load_pem_chain(other.server_ca_bundle_pem()) == [new_server]
    assert load_pem_chain(other.client_ca_bundle_pem()) == [new_client]
    assert len(load_pem_chain(other.leaf_pem("admin")[0])) == 1
    state = json.loads((tmp_path / "tls" / "state.json").read_text())
    assert state["overlap_until"] == {}


def test_rotate_rejects_unknown_ca(pki: ClusterPKI) -> None:
    with pytest.raises(ValueError):
        pki.rotate("bogus")


@pytest.mark.parametrize("elapsed_fraction,due", [(0.0, False), (0.5, False), (0.66, False),
                                                 (0.67, True), (0.9, True), (1.5, True)])
def test_needs_renewal_at_two_thirds(elapsed_fraction: float, due: bool) -> None:
    nb, na = T0, T0 + dt.timedelta(days=30)
    assert needs_renewal(nb, na, nb + (na - nb) * elapsed_fraction) is due


def test_renewal_due_when_signed_by_a_superseded_ca(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path, leaf_lifetime=dt.timedelta(days=10))
    pki.ensure([])
    admin = load_pem_chain(pki.leaf_pem("admin")[0])[0]
    now = dt.datetime.now(dt.UTC)
    assert not renewal_due(admin, now, pki.ca("client").cert)
    assert renewal_due(admin, now, pki.ca("server").cert)  # another CA
    assert renewal_due(admin, now + dt.timedelta(days=7), pki.ca("client").cert)


def test_refresh_renews_due_leaves_only(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path, leaf_lifetime=dt.timedelta(hours=3))
    pki.ensure([])
    now = dt.datetime.now(dt.UTC)
    assert pki.refresh(now=now + dt.timedelta(hours=1)) == []
    assert sorted(pki.refresh(now=now + dt.timedelta(hours=2, minutes=1))) == ["admin", "apiserver"]


def test_cert_status_rows(pki: ClusterPKI) -> None:
    now = dt.datetime.now(dt.UTC)
    admin = load_pem_chain(pki.leaf_pem("admin")[0])[0]
    assert cert_status("admin", admin, now, pki.ca("client").cert).status == "OK"
    assert cert_status("admin", admin, now + dt.timedelta(days=400)).status == "EXPIRED"
    assert cert_status("admin", admin, now - dt.timedelta(days=1)).status == "NOT-YET-VALID"
    assert cert_status("admin", admin, now + dt.timedelta(days=300),
                       pki.ca("client").cert).status == "RENEW-DUE"
    assert cert_status("x", None, now).status == "MISSING"
    rows = {r.name: r for r in pki.check()}
    assert {"server-ca", "client-ca", "requestheader-ca", "apiserver", "admin"} <= set(rows)
    assert 364 < rows["admin"].days_left <= 365


def test_issue_client_cert_ttl_and_identity(pki: ClusterPKI) -> None:
    chain, _ = pki.issue_client_cert("system:kube-scheduler", (), dt.timedelta(minutes=10))
    cert = load_pem_chain(chain)[0]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= dt.timedelta(minutes=11)
    verify_client_chain([cert], pki.client_ca_bundle(), dt.datetime.now(dt.UTC))
