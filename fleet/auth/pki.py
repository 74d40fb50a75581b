"""The server's TLS material: a cluster CA (kept) and a serving certificate.

kubectl (client-go) sends bearer tokens only over TLS, so the API is HTTPS
from the first start, like k3s: a self-signed cluster CA is generated once
into `<data-dir>/tls/` and its certificate goes into admin.kubeconfig as
`certificate-authority-data`; the serving certificate is re-issued by that CA
at every start with the names the server answers on (localhost, 127.0.0.1,
::1, the host name and the listen address), so it is never stale.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServingTLS:
    ca_cert_pem: bytes
    cert_file: Path
    key_file: Path


def write_private(path: Path, data: bytes | str) -> None:
    """Write a file only its owner can read (keys, kubeconfigs), atomically by rename."""
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_or_create_ca(tls_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = tls_dir / "ca.crt", tls_dir / "ca.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fleet-ca@{int(now.timestamp())}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, _key_pem(key))
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def ensure_serving_tls(data_dir: Path, extra_names: list[str] | None = None) -> ServingTLS:
    tls_dir = Path(data_dir) / "tls"
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert, ca_key = _load_or_create_ca(tls_dir)
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *(extra_names or [])]
    sans: list[x509.GeneralName] = []
    seen: set[str] = set()
    for n in names:
        if not n or n in seen or n in ("0.0.0.0", "::"):
            continue
        seen.add(n)
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-apiserver")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = tls_dir / "serving.crt", tls_dir / "serving.key"
    write_private(key_file, _key_pem(key))
    write_private(cert_file, cert.public_bytes(serialization.Encoding.PEM)
                   + ca_cert.public_bytes(serialization.Encoding.PEM))
    return ServingTLS(ca_cert.public_bytes(serialization.Encoding.PEM), cert_file, key_file)
