"""fleet/auth/x509.py: client certificates against the client CA bundle."""

from __future__ import annotations

import datetime as dt

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleet.auth import AuthenticationError, Credentials, UnionAuthenticator
from fleet.auth.pki import new_ca, subject_for
from fleet.auth.x509 import X509Authenticator

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
CA, CA_KEY = new_ca("test-client-ca", now=NOW)
OTHER, OTHER_KEY = new_ca("other-ca", now=NOW)


def leaf(cn: str = "jane", orgs: tuple[str, ...] = ("devs", "ops"), *, issuer: x509.Certificate = CA,
         key: ec.EllipticCurvePrivateKey = CA_KEY, not_before: dt.datetime | None = None,
         not_after: dt.datetime | None = None, ekus: list[x509.ObjectIdentifier] | None = None,
         is_ca: bool = False) -> bytes:
    k = ec.generate_private_key(ec.SECP256R1())
    b = (x509.CertificateBuilder().subject_name(subject_for(cn, orgs)).issuer_name(issuer.subject)
         .public_key(k.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(not_before or NOW - dt.timedelta(minutes=1))
         .not_valid_after(not_after or NOW + dt.timedelta(hours=1))
         .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if ekus is None:
        ekus = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if ekus:
        b = b.add_extension(x509.ExtendedKeyUsage(ekus), critical=False)
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def auth(*certs: bytes, bundle: list[x509.Certificate] | None = None) -> object:
    a = X509Authenticator(lambda: bundle if bundle is not None else [CA], clock=lambda: NOW)
    return trio.run(a.authenticate, Credentials({}, tuple(certs)))


def test_valid_certificate_maps_cn_and_o() -> None:
    user = auth(leaf())
    assert user.name == "jane" and user.groups == ("devs", "ops")  # type: ignore[attr-defined]


def test_node_identity() -> None:
    user = auth(leaf("system:node:n1", ("system:nodes",)))
    assert user.name == "system:node:n1" and user.groups == ("system:nodes",)  # type: ignore[attr-defined]


def test_no_certificate_is_none() -> None:
    assert auth() is None


@pytest.mark.parametrize("cert,reason", [
    (lambda: leaf(not_after=NOW - dt.timedelta(seconds=1),
                  not_before=NOW - dt.timedelta(hours=1)), "expired"),
    (lambda: leaf(not_before=NOW + dt.timedelta(minutes=5)), "not yet valid"),
    (lambda: leaf(issuer=OTHER, key=OTHER_KEY), "unknown authority"),
    (lambda: leaf(issuer=CA, key=OTHER_KEY), "unknown authority"),  # right name, wrong key
    (lambda: leaf(ekus=[]), "key usage"),
    (lambda: leaf(ekus=[ExtendedKeyUsageOID.SERVER_AUTH]), "key usage"),
    (lambda: leaf(is_ca=True), "CA certificate"),
    (lambda: b"not a certificate", "malformed"),
])
def test_bad_certificates_are_authentication_errors(cert: object, reason: str) -> None:
    with pytest.raises(AuthenticationError, match=reason):
        auth(cert())  # type: ignore[operator]


def test_no_common_name_refused() -> None:
    k = ec.generate_private_key(ec.SECP256R1())
    c = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "x")]))
         .issuer_name(CA.subject).public_key(k.public_key()).serial_number(1)
         .not_valid_before(NOW - dt.timedelta(minutes=1)).not_valid_after(NOW + dt.timedelta(hours=1))
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .sign(CA_KEY, hashes.SHA256()).public_bytes(serialization.Encoding.DER))
    with pytest.raises(AuthenticationError, match="common name"):
        auth(c)


def test_the_bundle_is_read_at_every_request() -> None:
    cert = leaf(issuer=OTHER, key=OTHER_KEY)
    bundle: list[x509.Certificate] = [CA]
    a = X509Authenticator(lambda: bundle, clock=lambda: NOW)
    with pytest.raises(AuthenticationError):
        trio.run(a.authenticate, Credentials({}, (cert,)))
    bundle.append(OTHER)
    assert trio.run(a.authenticate, Credentials({}, (cert,))).name == "jane"  # type: ignore[union-attr]


def test_a_sent_intermediate_that_is_no_ca_is_ignored() -> None:
    # An attacker's "intermediate" that is a leaf of the trusted CA cannot sign for others.
    attacker_key = ec.generate_private_key(ec.SECP256R1())
    fake = (x509.CertificateBuilder().subject_name(subject_for("mallory")).issuer_name(CA.subject)
            .public_key(attacker_key.public_key()).serial_number(2)
            .not_valid_before(NOW - dt.timedelta(minutes=1)).not_valid_after(NOW + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(CA_KEY, hashes.SHA256()))
    forged = leaf("admin", ("system:masters",), issuer=fake, key=attacker_key)
    with pytest.raises(AuthenticationError, match="unknown authority"):
        auth(forged, fake.public_bytes(serialization.Encoding.DER))


def test_union_puts_a_bad_certificate_as_401_even_with_no_other_credentials() -> None:
    a = UnionAuthenticator(X509Authenticator(lambda: [CA], clock=lambda: NOW))
    with pytest.raises(AuthenticationError):
        trio.run(a.authenticate, Credentials({}, (leaf(issuer=OTHER, key=OTHER_KEY),)))
    user = trio.run(a.authenticate, Credentials({}, (leaf(),)))
    assert user is not None and "system:authenticated" in user.groups


def test_remembered_result_still_honours_expiry_and_bundle_changes() -> None:
    now = [NOW]
    bundle: list[x509.Certificate] = [CA]
    a = X509Authenticator(lambda: bundle, clock=lambda: now[0])
    cert = leaf(not_after=NOW + dt.timedelta(minutes=10))
    assert a.verify((cert,)) is not None
    assert a.verify((cert,)) is not None  # from the cache
    now[0] = NOW + dt.timedelta(minutes=11)
    with pytest.raises(AuthenticationError, match="expired"):
        a.verify((cert,))
    now[0] = NOW
    bundle[:] = [OTHER]  # the CA left the bundle (end of a rotation overlap)
    with pytest.raises(AuthenticationError, match="unknown authority"):
        a.verify((cert,))
