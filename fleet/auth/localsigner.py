"""Signing CertificateSigningRequests with the cluster CA in `<data-dir>/tls/`.

The CSR signing controller (fleet/controllers/csrsigning.py) codes against one
method, `sign_csr(csr_pem, *, signer, usages, ttl) -> PEM`, the interface the PKI
(fleet/auth/pki.py `ClusterPKI`) exports.  `LocalSigner` is that method over the CA
files as they exist today (ca.crt / ca.key), so joining works before the PKI's
separate client CA lands; the server then hands the controller a `ClusterPKI`
instead (see `csr_signer`).

The certificate is what kube-controller-manager's local signer issues
(pkg/controller/certificates/authority): the request's subject and SANs, the
requested key usages and extended key usages, not before 5 minutes ago (clock
skew), not after `ttl` from now and never after the CA itself.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

BACKDATE = dt.timedelta(minutes=5)

_EKU = {
    "server auth": ExtendedKeyUsageOID.SERVER_AUTH,
    "client auth": ExtendedKeyUsageOID.CLIENT_AUTH,
    "code signing": ExtendedKeyUsageOID.CODE_SIGNING,
    "email protection": ExtendedKeyUsageOID.EMAIL_PROTECTION,
    "s/mime": ExtendedKeyUsageOID.EMAIL_PROTECTION,
    "timestamping": ExtendedKeyUsageOID.TIME_STAMPING,
    "ocsp signing": ExtendedKeyUsageOID.OCSP_SIGNING,
    "any": ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE,
}
_KU = {
    "digital signature": "digital_signature", "signing": "digital_signature",
    "content commitment": "content_commitment", "key encipherment": "key_encipherment",
    "key agreement": "key_agreement", "data encipherment": "data_encipherment",
    "cert sign": "key_cert_sign", "crl sign": "crl_sign",
    "encipher only": "encipher_only", "decipher only": "decipher_only",
}


class CSRSigner(Protocol):
    def sign_csr(self, csr_pem: bytes, *, signer: str, usages: list[str], ttl: dt.timedelta) -> bytes: ...


class LocalSigner:
    """Signs with `<tls_dir>/ca.crt` + `ca.key` (re-read when they change on disk)."""

    def __init__(self, tls_dir: Path) -> None:
        self.tls_dir = Path(tls_dir)
        self._loaded: tuple[float, x509.Certificate, Any] | None = None

    def _ca(self) -> tuple[x509.Certificate, Any]:
        cert_path, key_path = self.tls_dir / "ca.crt", self.tls_dir / "ca.key"
        mtime = max(cert_path.stat().st_mtime, key_path.stat().st_mtime)
        if self._loaded is None or self._loaded[0] != mtime:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            self._loaded = (mtime, cert, key)
        return self._loaded[1], self._loaded[2]

    def ca_pem(self) -> bytes:
        return self._ca()[0].public_bytes(serialization.Encoding.PEM)

    def sign_csr(self, csr_pem: bytes, *, signer: str, usages: list[str], ttl: dt.timedelta) -> bytes:
        ca_cert, ca_key = self._ca()
        req = x509.load_pem_x509_csr(csr_pem)
        now = dt.datetime.now(dt.UTC)
        not_after = min(now + ttl, ca_cert.not_valid_after_utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(req.subject)
                   .issuer_name(ca_cert.subject)
                   .public_key(req.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - BACKDATE)
                   .not_valid_after(not_after)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        ku = {v: False for v in set(_KU.values())}
        for u in usages:
            if u in _KU:
                ku[_KU[u]] = True
        if any(ku.values()):
            if not ku["key_agreement"]:
                ku["encipher_only"] = ku["decipher_only"] = False
            builder = builder.add_extension(x509.KeyUsage(**ku), critical=True)
        ekus = list(dict.fromkeys(_EKU[u] for u in usages if u in _EKU))
        if ekus:
            builder = builder.add_extension(x509.ExtendedKeyUsage(ekus), critical=False)
        try:
            sans = req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            builder = builder.add_extension(sans, critical=False)
        except x509.ExtensionNotFound:
            pass
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM)


def csr_signer(data_dir: Path) -> CSRSigner:
    """The signer the controller manager's CSR signing controller uses.

    The PKI's `ClusterPKI` replaces this at merge (it knows the client CA and the
    rotation overlap); until then the cluster CA files sign."""
    return LocalSigner(Path(data_dir) / "tls")
