"""x509 client-certificate authentication (kube-apiserver's --client-ca-file).

The TLS layer asks every client for a certificate but does not verify it
(fleet/server/tlsconn.py), so the chain reaches this authenticator as sent:

* no certificate: `None` (another authenticator may know the request);
* a leaf that chains to a CA of the client CA bundle (directly, or through an
  intermediate the client sent: the cross certificate of a CA rotation), is inside
  its validity window, carries the clientAuth extended key usage and is not a CA
  itself: the user CN, in the groups O (kube's `CommonNameUserConversion`);
* anything else: `AuthenticationError` with the reason (expired, not yet valid,
  unknown authority, wrong usage) for the log; the client sees a bare 401.

The bundle is asked for at every request (`bundle_provider`), so a CA rotation
takes effect without a restart.  A verified chain is remembered (the signature
checks cost ~0.5 ms) for as long as the bundle is the same and the chain's
validity window holds; only successes are remembered.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleet.auth import AuthenticationError, Credentials, UserInfo

BundleProvider = Callable[[], Sequence[x509.Certificate]]
MAX_INTERMEDIATES = 2
CACHE_SIZE = 1024


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _check_window(cert: x509.Certificate, now: dt.datetime, what: str) -> None:
    if now < cert.not_valid_before_utc:
        raise AuthenticationError(
            f"x509: {what} is not yet valid: current time {now:%Y-%m-%dT%H:%M:%SZ} is before "
            f"{cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ}")
    if now >= cert.not_valid_after_utc:
        raise AuthenticationError(
            f"x509: {what} has expired: current time {now:%Y-%m-%dT%H:%M:%SZ} is after "
            f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")


def verify_client_chain(chain: Sequence[x509.Certificate], roots: Sequence[x509.Certificate],
                        now: dt.datetime) -> list[x509.Certificate]:
    """Raise AuthenticationError unless chain[0] is a valid client certificate issued
    (through at most MAX_INTERMEDIATES of chain[1:]) by one of `roots`; the path
    (leaf, intermediates, root) otherwise."""
    leaf = chain[0]
    _check_window(leaf, now, "certificate")
    if _is_ca(leaf):
        raise AuthenticationError("x509: a CA certificate cannot be a client certificate")
    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        raise AuthenticationError("x509: certificate specifies an incompatible key usage "
                                  "(no extended key usage)") from None
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in eku:
        raise AuthenticationError("x509: certificate specifies an incompatible key usage")
    intermediates = [c for c in chain[1:] if _is_ca(c)]
    path = [leaf]
    for _depth in range(MAX_INTERMEDIATES + 1):
        current = path[-1]
        for root in roots:
            if _signed_by(current, root):
                _check_window(root, now, "certificate authority")
                return [*path, root]
        step = next((c for c in intermediates if c not in path and _signed_by(current, c)), None)
        if step is None:
            break
        _check_window(step, now, "intermediate certificate")
        path.append(step)
    raise AuthenticationError("x509: certificate signed by unknown authority")


def user_of(cert: x509.Certificate) -> UserInfo:
    """CN -> user name, each O -> a group (kube-apiserver's mapping)."""
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(cns[0].value) if cns else ""
    if not name:
        raise AuthenticationError("x509: certificate has no common name")
    orgs = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    return UserInfo(name, groups=orgs)


class X509Authenticator:
    """Client certificates verified against the client CA bundle (module docstring)."""

    def __init__(self, bundle_provider: BundleProvider,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.bundle_provider = bundle_provider
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        # chain DER -> (user, the bundle it was verified against, valid from, until)
        self._cache: dict[tuple[bytes, ...], tuple[UserInfo, tuple[x509.Certificate, ...],
                                                   dt.datetime, dt.datetime]] = {}

    async def authenticate(self, creds: Credentials) -> UserInfo | None:
        return self.verify(creds.peer_certs)

    def verify(self, peer_certs: Sequence[bytes]) -> UserInfo | None:
        if not peer_certs:
            return None
        key = tuple(bytes(d) for d in peer_certs)
        bundle = tuple(self.bundle_provider())
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[1] == bundle and hit[2] <= now < hit[3]:
            return hit[0]
        try:
            chain = [x509.load_der_x509_certificate(d) for d in key]
        except ValueError as e:
            raise AuthenticationError(f"x509: malformed certificate: {e}") from None
        path = verify_client_chain(chain, bundle, now)
        user = user_of(chain[0])
        if len(self._cache) >= CACHE_SIZE:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (user, bundle, max(c.not_valid_before_utc for c in path),
                            min(c.not_valid_after_utc for c in path))
        return user
