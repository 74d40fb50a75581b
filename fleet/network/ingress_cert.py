"""The ingress' default TLS certificate: self-signed, made once, kept in the data dir.

An HTTPS request whose SNI name no TLS Secret covers (or that sends none) still
gets a handshake — with this certificate, as ingress-nginx serves its "Fake
Certificate" — so the client sees a certificate error rather than a reset, and an
Ingress without `tls` can still be reached over HTTPS.  It is generated on the first
start into `<data-dir>/ingress/default.crt` / `default.key` (key mode 0600, written
with `fleet.auth.pki.write_private`) and reused afterwards, re-made only when it no
longer parses or is about to expire.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleet.auth.pki import write_private
from fleet.network.routetable import Certificate

log = logging.getLogger(__name__)

COMMON_NAME = "Fleet Ingress Default Certificate"
VALID_DAYS = 3650
RENEW_BEFORE = dt.timedelta(days=30)


def _usable(cert_pem: bytes, key_pem: bytes) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    if cert.public_key().public_bytes(serialization.Encoding.DER,
                                      serialization.PublicFormat.SubjectPublicKeyInfo) != \
            key.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo):
        return False
    return cert.not_valid_after_utc - RENEW_BEFORE > dt.datetime.now(dt.UTC)


def make_self_signed(common_name: str = COMMON_NAME, days: int = VALID_DAYS) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a fresh self-signed serving certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("ingress.local")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def ensure_default_certificate(directory: Path) -> Certificate:
    """The default certificate kept in `directory` (made there if absent or unusable)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = directory / "default.crt", directory / "default.key"
    if cert_path.exists() and key_path.exists():
        cert_pem, key_pem = cert_path.read_bytes(), key_path.read_bytes()
        if _usable(cert_pem, key_pem):
            return Certificate(hostnames=("",), cert_pem=cert_pem, key_pem=key_pem)
        log.warning("ingress: the default certificate in %s is unusable or expiring; making a new one",
                    directory)
    cert_pem, key_pem = make_self_signed()
    write_private(key_path, key_pem)
    write_private(cert_path, cert_pem)
    return Certificate(hostnames=("",), cert_pem=cert_pem, key_pem=key_pem)


__all__ = ["ensure_default_certificate", "make_self_signed"]
