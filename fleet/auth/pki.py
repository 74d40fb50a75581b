"""The cluster's PKI: three CAs, the leaf certificates the server keeps on disk,
CSR signing, trust bundles, renewal decisions and CA rotation.

Everything lives in `<data-dir>/tls/` (0700, keys 0600), created at the first start:

* the **server CA** (`ca.crt`/`ca.key`, the file names of earlier releases, so an
  existing cluster keeps its CA) signs serving certificates: the API server's
  (`serving.crt`, SANs for every name it answers on) and the agents'
  (`kubernetes.io/kubelet-serving`);
* the **client CA** (`client-ca.crt`) signs client certificates: the admin's
  (`admin.crt`, CN=system:admin O=system:masters, in admin.kubeconfig) on disk;
  in memory, renewed by fleet/auth/certrotation.py, the API server's own for
  calling agents (CN=fleet-apiserver-kubelet-client) and the built-in components';
  the nodes' through CSRs (`kube-apiserver-client[-kubelet]`);
* the **request-header CA** (`requestheader-ca.crt`) is kept for a front proxy.

All keys are EC P-256.  Leaves renew once 2/3 of their lifetime has passed
(`needs_renewal`, a pure decision), or when they were signed by a CA that is no
longer the current one.

CA rotation (`rotate`, `fleet certs rotate`): the new CA replaces the old as the
signer, the old one stays in the trust bundles (`*_ca_bundle_pem`) until the end
of an overlap window (by default one leaf lifetime: every leaf the old CA signed
has expired or renewed by then), and the new CA is cross-signed by the old one
(`<ca>.cross.crt`).  Leaves are served with that cross certificate as an
intermediate, so a peer that still trusts only the old CA builds
leaf -> new CA (cross) -> old CA and never loses trust, while peers that have the
new bundle verify leaf -> new CA directly.

A file lock (`tls/.lock`) serialises the server's renewal loop and the CLI.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import os
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SIGNER_CLIENT = "kubernetes.io/kube-apiserver-client"
SIGNER_KUBELET_CLIENT = "kubernetes.io/kube-apiserver-client-kubelet"
SIGNER_KUBELET_SERVING = "kubernetes.io/kubelet-serving"
SIGNERS = (SIGNER_CLIENT, SIGNER_KUBELET_CLIENT, SIGNER_KUBELET_SERVING)

CA_NAMES = ("server", "client", "requestheader")
_CA_STEM = {"server": "ca", "client": "client-ca", "requestheader": "requestheader-ca"}
_CA_CN = {"server": "fleet-ca", "client": "fleet-client-ca", "requestheader": "fleet-requestheader-ca"}

DEFAULT_CA_LIFETIME = dt.timedelta(days=3650)
DEFAULT_LEAF_LIFETIME = dt.timedelta(days=365)
RENEW_FRACTION = 2 / 3
# Backdating, for clocks a little behind ours (kube's signer backdates 5 min).
BACKDATE = dt.timedelta(minutes=5)

ADMIN_USER = "system:admin"
KUBELET_CLIENT_USER = "fleet-apiserver-kubelet-client"
MASTERS = "system:masters"

# certificates.k8s.io usages -> key usage flags / extended key usages.
_KEY_USAGES = {"digital signature", "key encipherment", "signing"}
_EXT_USAGES = {"client auth": ExtendedKeyUsageOID.CLIENT_AUTH,
               "server auth": ExtendedKeyUsageOID.SERVER_AUTH}
# What each signer may sign (Kubernetes' "Kubernetes signers" page).
_SIGNER_USAGES = {
    SIGNER_CLIENT: {"client auth", "digital signature", "key encipherment"},
    SIGNER_KUBELET_CLIENT: {"client auth", "digital signature", "key encipherment"},
    SIGNER_KUBELET_SERVING: {"server auth", "digital signature", "key encipherment"},
}


class CSRError(ValueError):
    """The request cannot be signed (bad signature, usages the signer refuses ...)."""


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_pem_chain(data: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data) if data.strip() else []


def needs_renewal(not_before: dt.datetime, not_after: dt.datetime, now: dt.datetime,
                  fraction: float = RENEW_FRACTION) -> bool:
    """Renew once `fraction` of the certificate's lifetime has passed (or it expired)."""
    return now >= not_before + (not_after - not_before) * fraction


def renewal_due(cert: x509.Certificate, now: dt.datetime, current_issuer: x509.Certificate,
                fraction: float = RENEW_FRACTION) -> bool:
    """A leaf needs re-issuing: 2/3 of its life gone, or signed by a CA that is no
    longer the current one (after a rotation)."""
    if cert.issuer != current_issuer.subject or cert.signature_hash_algorithm is None:
        return True
    try:
        cert.verify_directly_issued_by(current_issuer)
    except (ValueError, TypeError, InvalidSignature):
        return True
    return needs_renewal(cert.not_valid_before_utc, cert.not_valid_after_utc, now, fraction)


def _ca_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                         key_agreement=False, encipher_only=False, decipher_only=False)


def _leaf_key_usage(key_encipherment: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                         content_commitment=False, key_encipherment=key_encipherment,
                         data_encipherment=False, key_agreement=False, encipher_only=False,
                         decipher_only=False)


def new_ca(common_name: str, lifetime: dt.timedelta = DEFAULT_CA_LIFETIME, *,
           now: dt.datetime | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA.  Its CN carries the creation time (kube's `<name>@<unix time>`)
    and a random tag, so CAs rotated within one second still differ by name (chain
    building goes by name)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or now_utc()
    cn = f"{common_name}@{int(now.timestamp())}-{secrets.token_hex(3)}"
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_ca_key_usage(), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def cross_sign(new: x509.Certificate, old: x509.Certificate, old_key: ec.EllipticCurvePrivateKey,
               until: dt.datetime) -> x509.Certificate:
    """`new` CA's name and key, issued by `old`: the bridge for peers that trust only `old`."""
    builder = (x509.CertificateBuilder().subject_name(new.subject).issuer_name(old.subject)
               .public_key(new.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(new.not_valid_before_utc)
               .not_valid_after(min(until, old.not_valid_after_utc)))
    for ext in new.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    return builder.sign(old_key, hashes.SHA256())


def sans_for(names: list[str]) -> list[x509.GeneralName]:
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
    return sans


def _sign_leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, subject: x509.Name,
               public_key: ec.EllipticCurvePublicKey | object, *, ttl: dt.timedelta,
               eku: list[x509.ObjectIdentifier], sans: list[x509.GeneralName] | None = None,
               key_encipherment: bool = False, now: dt.datetime | None = None) -> x509.Certificate:
    now = now or now_utc()
    # Never beyond the CA's own life; short test lifetimes are not backdated much.
    backdate = min(BACKDATE, ttl / 10)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
               .public_key(public_key)  # type: ignore[arg-type]
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - backdate)
               .not_valid_after(min(now + ttl, ca.not_valid_after_utc))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(_leaf_key_usage(key_encipherment), critical=True)
               .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def subject_for(cn: str, orgs: list[str] | tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@dataclass
class CA:
    """One CA as loaded: the current signer, the certificates still trusted (the
    previous CA during an overlap window) and the cross certificate, if any."""

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    previous: list[x509.Certificate]
    cross: x509.Certificate | None = None

    def bundle(self) -> list[x509.Certificate]:
        return [self.cert, *self.previous]

    def chain_tail(self) -> bytes:
        """What goes after a leaf it signed: the cross certificate during an overlap."""
        return cert_pem(self.cross) if self.cross is not None else b""


@dataclass(frozen=True)
class Leaf:
    """A leaf the server keeps on disk and renews."""

    name: str       # what `fleet certs check` calls it
    stem: str       # <stem>.crt / <stem>.key
    ca: str         # which CA signs it
    cn: str
    orgs: tuple[str, ...] = ()
    serving: bool = False


LEAVES = (
    Leaf("apiserver", "serving", "server", "fleet-apiserver", serving=True),
    Leaf("admin", "admin", "client", ADMIN_USER, (MASTERS,)),
)


@dataclass(frozen=True)
class CertStatus:
    name: str
    subject: str
    issuer: str
    not_after: dt.datetime
    days_left: float
    status: str  # OK | RENEW-DUE | EXPIRED | NOT-YET-VALID | MISSING


def cert_status(name: str, cert: x509.Certificate | None, now: dt.datetime,
                current_issuer: x509.Certificate | None = None) -> CertStatus:
    """One row of `fleet certs check` (pure)."""
    if cert is None:
        return CertStatus(name, "", "", now, 0.0, "MISSING")
    nb, na = cert.not_valid_before_utc, cert.not_valid_after_utc
    left = (na - now).total_seconds() / 86400
    if now >= na:
        status = "EXPIRED"
    elif now < nb:
        status = "NOT-YET-VALID"
    elif current_issuer is not None and renewal_due(cert, now, current_issuer):
        status = "RENEW-DUE"
    else:
        status = "OK"
    return CertStatus(name, cert.subject.rfc4514_string(), cert.issuer.rfc4514_string(), na,
                      left, status)


class ClusterPKI:
    """The TLS material of one data directory (see the module docstring)."""

    def __init__(self, data_dir: Path | str, *, leaf_lifetime: dt.timedelta | None = None,
                 ca_lifetime: dt.timedelta = DEFAULT_CA_LIFETIME) -> None:
        self.tls_dir = Path(data_dir) / "tls"
        self.state_file = self.tls_dir / "state.json"
        self.ca_lifetime = ca_lifetime
        self._leaf_lifetime = leaf_lifetime
        self.cas: dict[str, CA] = {}
        self.serving_names: list[str] = []

    # ------------------------------------------------------------------ state

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.tls_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _state(self) -> dict[str, object]:
        try:
            data = json.loads(self.state_file.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_state(self, state: dict[str, object]) -> None:
        write_private(self.state_file, json.dumps(state, indent=1, sort_keys=True))

    @property
    def leaf_lifetime(self) -> dt.timedelta:
        if self._leaf_lifetime is not None:
            return self._leaf_lifetime
        seconds = self._state().get("leaf_lifetime_seconds")
        if isinstance(seconds, (int, float)) and seconds > 0:
            return dt.timedelta(seconds=seconds)
        return DEFAULT_LEAF_LIFETIME

    def path(self, stem: str, ext: str) -> Path:
        return self.tls_dir / f"{stem}.{ext}"

    # ------------------------------------------------------------------ CAs

    def load(self, now: dt.datetime | None = None) -> None:
        """(Re)read the CAs from disk, creating the ones missing; drops a previous CA
        whose overlap window has ended."""
        now = now or now_utc()
        self.tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = self._state()
        if self._leaf_lifetime is not None:
            state["leaf_lifetime_seconds"] = self._leaf_lifetime.total_seconds()
        overlaps = state.setdefault("overlap_until", {})
        assert isinstance(overlaps, dict)
        for name in CA_NAMES:
            stem = _CA_STEM[name]
            crt, key_path = self.path(stem, "crt"), self.path(stem, "key")
            if crt.exists() and key_path.exists():
                cert = x509.load_pem_x509_certificate(crt.read_bytes())
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
                assert isinstance(key, ec.EllipticCurvePrivateKey)
            else:
                cert, key = new_ca(_CA_CN[name], self.ca_lifetime, now=now)
                write_private(key_path, _key_pem(key))
                write_private(crt, cert_pem(cert))
            prev_path, cross_path = self.path(stem, "prev.crt"), self.path(stem, "cross.crt")
            until = overlaps.get(name)
            previous: list[x509.Certificate] = []
            cross = None
            if prev_path.exists() and isinstance(until, (int, float)) and now.timestamp() < until:
                previous = [c for c in load_pem_chain(prev_path.read_bytes())
                            if c.not_valid_after_utc > now]
                if cross_path.exists():
                    cross = x509.load_pem_x509_certificate(cross_path.read_bytes())
                    if cross.not_valid_after_utc <= now or cross.public_key() != cert.public_key():
                        cross = None
            else:
                for p in (prev_path, cross_path):
                    p.unlink(missing_ok=True)
                overlaps.pop(name, None)
            self.cas[name] = CA(name, cert, key, previous, cross)
        self._save_state(state)

    def ca(self, name: str) -> CA:
        if name not in self.cas:
            self.load()
        return self.cas[name]

    def fingerprint(self) -> tuple[bytes, ...]:
        """Changes whenever a CA or a bundle changes (the renewal loop's reload trigger)."""
        return tuple(c.fingerprint(hashes.SHA256()) for n in CA_NAMES for c in self.ca(n).bundle())

    def server_ca_bundle_pem(self) -> bytes:
        """Every server CA trusted now: the current one and, during a rotation's overlap
        window, the previous one (what agents and kubectl verify the server with)."""
        return b"".join(cert_pem(c) for c in self.ca("server").bundle())

    def client_ca_bundle_pem(self) -> bytes:
        """Every client CA trusted now (what client certificates are verified against)."""
        return b"".join(cert_pem(c) for c in self.ca("client").bundle())

    def requestheader_ca_bundle_pem(self) -> bytes:
        return b"".join(cert_pem(c) for c in self.ca("requestheader").bundle())

    def client_ca_bundle(self) -> list[x509.Certificate]:
        return self.ca("client").bundle()

    # ------------------------------------------------------------------ issuing

    def issue_client_cert(self, cn: str, orgs: list[str] | tuple[str, ...] = (),
                          ttl: dt.timedelta | None = None) -> tuple[bytes, bytes]:
        """A fresh key and client certificate (CN=user, O=groups) from the client CA:
        (certificate chain PEM, key PEM)."""
        ca = self.ca("client")
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign_leaf(ca.cert, ca.key, subject_for(cn, orgs), key.public_key(),
                          ttl=ttl or self.leaf_lifetime, eku=[ExtendedKeyUsageOID.CLIENT_AUTH])
        return cert_pem(cert) + ca.chain_tail(), _key_pem(key)

    def issue_serving_cert(self, names: list[str], cn: str,
                           ttl: dt.timedelta | None = None) -> tuple[bytes, bytes]:
        """A fresh key and serving certificate for `names` (SANs) from the server CA."""
        ca = self.ca("server")
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign_leaf(ca.cert, ca.key, subject_for(cn), key.public_key(),
                          ttl=ttl or self.leaf_lifetime, eku=[ExtendedKeyUsageOID.SERVER_AUTH],
                          sans=sans_for(names))
        return cert_pem(cert) + ca.chain_tail(), _key_pem(key)

    def sign_csr(self, csr_pem: bytes, *, signer: str, usages: list[str],
                 ttl: dt.timedelta) -> bytes:
        """Sign a PKCS#10 request for one of the Kubernetes signers; the certificate PEM
        (with the cross certificate after it during a CA overlap).  CSRError if the
        request's signature is bad or it asks for usages the signer does not give."""
        if signer not in SIGNERS:
            raise CSRError(f"unknown signer {signer!r}")
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as e:
            raise CSRError(f"invalid certificate request: {e}") from None
        if not csr.is_signature_valid:
            raise CSRError("the certificate request's signature is invalid")
        wanted = {u.lower() for u in usages}
        refused = wanted - _SIGNER_USAGES[signer]
        if refused:
            raise CSRError(f"signer {signer} does not permit usages {sorted(refused)}")
        eku = [_EXT_USAGES[u] for u in sorted(wanted) if u in _EXT_USAGES]
        if not eku:
            raise CSRError(f"signer {signer} requires usage "
                           f"{'server auth' if signer == SIGNER_KUBELET_SERVING else 'client auth'}")
        serving = signer == SIGNER_KUBELET_SERVING
        ca = self.ca("server" if serving else "client")
        sans: list[x509.GeneralName] = []
        if serving:
            with contextlib.suppress(x509.ExtensionNotFound):
                ext = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
                sans = [n for n in ext.value if isinstance(n, (x509.DNSName, x509.IPAddress))]
        cert = _sign_leaf(ca.cert, ca.key, csr.subject, csr.public_key(), ttl=ttl, eku=eku,
                          sans=sans, key_encipherment="key encipherment" in wanted)
        return cert_pem(cert) + ca.chain_tail()

    # ------------------------------------------------------------------ on-disk leaves

    def leaf_cert(self, leaf: Leaf) -> x509.Certificate | None:
        try:
            return load_pem_chain(self.path(leaf.stem, "crt").read_bytes())[0]
        except (OSError, ValueError, IndexError):
            return None

    def _issue_leaf(self, leaf: Leaf, names: list[str]) -> None:
        if leaf.serving:
            chain, key = self.issue_serving_cert(names, leaf.cn)
        else:
            chain, key = self.issue_client_cert(leaf.cn, leaf.orgs)
        write_private(self.path(leaf.stem, "key"), key)
        write_private(self.path(leaf.stem, "crt"), chain)

    def _leaf_stale(self, leaf: Leaf, cert: x509.Certificate | None, now: dt.datetime,
                    names: list[str]) -> bool:
        if cert is None or renewal_due(cert, now, self.ca(leaf.ca).cert):
            return True
        if leaf.serving:
            try:
                have = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
            except x509.ExtensionNotFound:
                return True
            return have != set(sans_for(names))
        return False

    def refresh(self, names: list[str] | None = None, now: dt.datetime | None = None) -> list[str]:
        """Load the CAs and re-issue every on-disk leaf that is missing, due for renewal,
        signed by a superseded CA, or (the serving certificate) for other names.
        Returns the names of the leaves re-issued."""
        now = now or now_utc()
        with self.locked():
            self.load(now)
            state = self._state()
            if names is not None:
                state["serving_names"] = list(dict.fromkeys(names))
                self._save_state(state)
            stored = state.get("serving_names")
            serving_names = list(stored) if isinstance(stored, list) else default_serving_names()
            self.serving_names = serving_names
            renewed = []
            for leaf in LEAVES:
                if self._leaf_stale(leaf, self.leaf_cert(leaf), now, serving_names):
                    self._issue_leaf(leaf, serving_names)
                    renewed.append(leaf.name)
            return renewed

    def ensure(self, names: list[str]) -> None:
        """At server start: CAs created if missing, leaves current for `names`."""
        self.refresh(default_serving_names(names))

    # ------------------------------------------------------------------ rotation

    def rotate(self, which: str, *, overlap: dt.timedelta | None = None,
               now: dt.datetime | None = None) -> list[str]:
        """Replace CA(s) (`server`, `client`, `requestheader` or `all`), keeping the old one
        trusted for `overlap` (default: one leaf lifetime), then re-issue the leaves.
        Returns the names of the CAs rotated."""
        now = now or now_utc()
        names = list(CA_NAMES) if which == "all" else [which]
        if any(n not in CA_NAMES for n in names):
            raise ValueError(f"unknown CA {which!r}: one of {', '.join(CA_NAMES)} or all")
        overlap = overlap if overlap is not None else self.leaf_lifetime
        with self.locked():
            self.load(now)
            state = self._state()
            overlaps = state.setdefault("overlap_until", {})
            assert isinstance(overlaps, dict)
            for name in names:
                old = self.cas[name]
                stem = _CA_STEM[name]
                cert, key = new_ca(_CA_CN[name], self.ca_lifetime, now=now)
                until = now + overlap
                # The previous CAs still inside their window stay trusted as well.
                trusted = [old.cert, *old.previous]
                write_private(self.path(stem, "prev.crt"), b"".join(cert_pem(c) for c in trusted))
                write_private(self.path(stem, "cross.crt"), cert_pem(cross_sign(cert, old.cert, old.key,
                                                                                until)))
                write_private(self.path(stem, "key"), _key_pem(key))
                write_private(self.path(stem, "crt"), cert_pem(cert))
                overlaps[name] = until.timestamp()
            self._save_state(state)
        self.refresh(now=now)
        return names

    # ------------------------------------------------------------------ reporting

    def check(self, now: dt.datetime | None = None) -> list[CertStatus]:
        """Every CA (and previous CA) and on-disk leaf, for `fleet certs check`."""
        now = now or now_utc()
        with self.locked():
            self.load(now)
        rows = []
        for name in CA_NAMES:
            ca = self.cas[name]
            rows.append(cert_status(f"{name}-ca", ca.cert, now))
            rows += [cert_status(f"{name}-ca (previous)", c, now) for c in ca.previous]
        for leaf in LEAVES:
            rows.append(cert_status(leaf.name, self.leaf_cert(leaf), now, self.cas[leaf.ca].cert))
        return rows

    # ------------------------------------------------------------------ files

    @property
    def serving_cert_file(self) -> Path:
        return self.path("serving", "crt")

    @property
    def serving_key_file(self) -> Path:
        return self.path("serving", "key")

    def leaf_pem(self, name: str) -> tuple[bytes, bytes]:
        """(certificate chain, key) of an on-disk leaf by name."""
        leaf = next(x for x in LEAVES if x.name == name)
        return self.path(leaf.stem, "crt").read_bytes(), self.path(leaf.stem, "key").read_bytes()


def default_serving_names(extra: list[str] | None = None) -> list[str]:
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *(extra or [])]
    return [n for n in dict.fromkeys(names) if n and n not in ("0.0.0.0", "::")]


@dataclass(frozen=True)
class ServingTLS:
    ca_cert_pem: bytes
    cert_file: Path
    key_file: Path


def ensure_serving_tls(data_dir: Path, extra_names: list[str] | None = None) -> ServingTLS:
    """The server CA bundle and a current serving certificate for `extra_names`
    (and localhost, the host name): the PKI created on first use."""
    pki = ClusterPKI(data_dir)
    pki.ensure(extra_names or [])
    return ServingTLS(pki.server_ca_bundle_pem(), pki.serving_cert_file, pki.serving_key_file)
