"""ServiceAccount tokens: the cluster's signing keys, issuing bound tokens, verifying them.

Kubernetes' bound ServiceAccount tokens are JWTs signed by a cluster key
(kube-apiserver's `--service-account-signing-key-file`), shaped by
pkg/serviceaccount/claims.go:

    {"iss": <--service-account-issuer>, "sub": "system:serviceaccount:<ns>:<name>",
     "aud": [...], "exp": ..., "iat": ..., "nbf": ..., "jti": <uuid>,
     "kubernetes.io": {"namespace": ns, "serviceaccount": {"name", "uid"},
                       "pod"|"secret"|"node": {"name", "uid"}, "warnafter": ...}}

This module owns:

* `SigningKeys`: the current signing key (`<data-dir>/tls/sa.key`, RSA 2048 made at
  first start, RS256; an EC P-256 key there is used with ES256) and the public keys
  still accepted for verification after a rotation (`<data-dir>/tls/sa.pub`, PEM
  public keys, kube-apiserver's `--service-account-key-file`).  Key IDs are
  kube-apiserver's: base64url(SHA-256(PKIX DER of the public key)).  `rotate_signing_key`
  keeps the old public key for verification and makes a new signing key; `KeyFiles`
  reloads the keys in place when those files change (no restart needed).
* `TokenIssuer.issue(...)`: a bound token (TokenRequest's `token.Claims`).
* `ServiceAccountTokenAuthenticator`: kube-apiserver's jwtTokenAuthenticator + the
  bound-token validator — a bearer token whose (unverified) `iss` is not ours is
  None (another authenticator may know it); otherwise signature, issuer, audiences
  (intersected with the API audiences, or a TokenReview's requested ones: the
  `authenticate_token` method TokenReview calls), times
  (60 s leeway, go-jose's DefaultLeeway), then that the ServiceAccount and the
  bound Pod/Secret/Node still exist with the same UIDs, read from the store on
  every request (a deleted ServiceAccount's token stops working at once).

Failure messages are kube-apiserver's; they go to the log and a TokenReview's
`status.error`, never into a 401.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from fleet.api import meta
from fleet.auth import (
    SERVICE_ACCOUNT_USER_PREFIX,
    SERVICE_ACCOUNTS_GROUP,
    AuthenticationError,
    Credentials,
    UserInfo,
)
from fleet.auth.pki import write_private
from fleet.store import KeyNotFound, Store

log = logging.getLogger(__name__)

DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# go-jose's jwt.DefaultLeeway: clock skew tolerated on exp/nbf/iat and on deletions.
LEEWAY = 60
# Projected tokens that ask for exactly this many seconds get `warnafter` and a year of
# validity when --service-account-extend-token-expiration is on (claims.go).
WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS = 60 * 60 + 7
EXPIRATION_EXTENSION_SECONDS = 24 * 365 * 60 * 60

# user.Info extra keys (k8s.io/apiserver/pkg/authentication/serviceaccount).
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
NODE_UID_KEY = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"



@dataclass
class ServiceAccountConfig:
    """kube-apiserver's --service-account-* and --api-audiences flags."""

    # --service-account-issuer (repeatable): the first issues tokens, all are accepted.
    issuers: list[str] = field(default_factory=lambda: [DEFAULT_ISSUER])
    # --api-audiences: what a token must be meant for to reach this API (default: the issuer).
    api_audiences: list[str] = field(default_factory=list)
    # --service-account-signing-key-file (default <data-dir>/tls/sa.key, made at first start).
    signing_key_file: Path | None = None
    # --service-account-key-file (repeatable): more public keys that verify tokens.
    key_files: list[Path] = field(default_factory=list)
    # --service-account-max-token-expiration in seconds (0: no maximum).
    max_token_expiration: int = 0
    # --service-account-extend-token-expiration.
    extend_token_expiration: bool = True
    # --service-account-jwks-uri (default <issuer>/openid/v1/jwks).
    jwks_uri: str = ""

    @property
    def audiences(self) -> list[str]:
        return list(self.api_audiences or self.issuers[:1])


PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


def key_id(public: PublicKey) -> str:
    """kube-apiserver's key ID: unpadded base64url of the SHA-256 of the PKIX DER."""
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).decode().rstrip("=")


def algorithm_for(key: PrivateKey | PublicKey) -> str:
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return "RS256"
    curve = key.curve.name
    algs = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
    if curve not in algs:
        raise ValueError(f"unknown private key curve {curve}, must be 256, 384, or 521")
    return algs[curve]


def jwk(public: PublicKey) -> dict[str, Any]:
    """The public key as a JWK, as kube-apiserver's /openid/v1/jwks lists it."""
    if isinstance(public, rsa.RSAPublicKey):
        doc = RSAAlgorithm.to_jwk(public, as_dict=True)
    else:
        doc = ECAlgorithm.to_jwk(public, as_dict=True)
    doc.pop("key_ops", None)
    return {"use": "sig", "kty": doc.pop("kty"), "kid": key_id(public), "alg": algorithm_for(public), **doc}


@dataclass
class SigningKeys:
    """The key tokens are signed with and every public key that verifies them."""

    signing: PrivateKey
    verifying: list[PublicKey]

    @property
    def kid(self) -> str:
        return key_id(self.signing.public_key())

    @property
    def algorithm(self) -> str:
        return algorithm_for(self.signing)

    def keys_for(self, kid: str) -> list[PublicKey]:
        """The public keys for a token's `kid` (all of them when it has none)."""
        if not kid:
            return list(self.verifying)
        return [k for k in self.verifying if key_id(k) == kid]

    def jwks(self) -> dict[str, Any]:
        return {"keys": [jwk(k) for k in self.verifying]}

    def algorithms(self) -> list[str]:
        return sorted({algorithm_for(k) for k in self.verifying})


def _load_private(pem: bytes) -> PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError("the service account signing key must be an RSA or EC private key")
    algorithm_for(key)
    return key


_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----.*?-----END \1-----", re.DOTALL)


def _load_publics(pem: bytes) -> list[PublicKey]:
    """Every PEM public key (or private key: its public half) in `pem`."""
    out: list[PublicKey] = []
    for m in _PEM_BLOCK.finditer(pem):
        if m.group(1).endswith(b"PRIVATE KEY"):
            pub: Any = _load_private(m.group(0)).public_key()
        else:
            pub = serialization.load_pem_public_key(m.group(0))
        if not isinstance(pub, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
            raise ValueError("service account verification keys must be RSA or EC keys")
        out.append(pub)
    return out


def _private_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _public_pem(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def new_signing_key() -> PrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def load_or_create_keys(tls_dir: Path, *, signing_key_file: Path | None = None,
                        extra_key_files: Sequence[Path] = ()) -> SigningKeys:
    """The signing key (`tls/sa.key`, made at first start) and the verification keys:
    its public key, the previous ones kept in `tls/sa.pub`, and `extra_key_files`."""
    tls_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = signing_key_file or tls_dir / "sa.key"
    if path.exists() or signing_key_file is not None:  # a key file named by a flag must exist
        signing = _load_private(path.read_bytes())
    else:
        signing = new_signing_key()
        write_private(path, _private_pem(signing))
    verifying: list[PublicKey] = [signing.public_key()]
    for f in [tls_dir / "sa.pub", *extra_key_files]:
        if f.exists():
            verifying += _load_publics(f.read_bytes())
    seen: set[str] = set()
    unique = []
    for k in verifying:
        if key_id(k) not in seen:
            seen.add(key_id(k))
            unique.append(k)
    return SigningKeys(signing, unique)


def rotate_signing_key(tls_dir: Path, *, keep: int = 1) -> SigningKeys:
    """Make a new signing key; the old one's public key stays in `tls/sa.pub` (with at
    most `keep` older ones) so tokens it signed verify until they expire.  The server
    loads keys at start: restart it (or its replicas) after a rotation."""
    old = load_or_create_keys(tls_dir)
    previous = [old.signing.public_key()] + [k for k in old.verifying[1:]][: max(keep - 1, 0)]
    write_private(tls_dir / "sa.pub", b"".join(_public_pem(k) for k in previous))
    write_private(tls_dir / "sa.key", _private_pem(new_signing_key()))
    return load_or_create_keys(tls_dir)


class KeyFiles:
    """Where `SigningKeys` come from, reloaded in place when the files change (a
    `rotate_signing_key` by `fleet` on the same data dir takes effect without a restart)."""

    def __init__(self, keys: SigningKeys, tls_dir: Path, *, signing_key_file: Path | None = None,
                 extra_key_files: Sequence[Path] = ()) -> None:
        self.keys = keys
        self.tls_dir = tls_dir
        self.signing_key_file = signing_key_file
        self.extra_key_files = list(extra_key_files)
        self._stamp = self.stamp()

    def files(self) -> list[Path]:
        return [self.signing_key_file or self.tls_dir / "sa.key", self.tls_dir / "sa.pub", *self.extra_key_files]

    def stamp(self) -> tuple[tuple[str, int, int], ...]:
        out = []
        for f in self.files():
            try:
                st = f.stat()
                out.append((str(f), st.st_mtime_ns, st.st_size))
            except FileNotFoundError:
                out.append((str(f), 0, 0))
        return tuple(out)

    def reload_if_changed(self) -> bool:
        """Reload when a key file changed; True if the keys were replaced.  A file
        caught half-written (or a bad key) keeps the keys in use, and is retried."""
        stamp = self.stamp()
        if stamp == self._stamp:
            return False
        try:
            fresh = load_or_create_keys(self.tls_dir, signing_key_file=self.signing_key_file,
                                        extra_key_files=self.extra_key_files)
        except (ValueError, OSError) as e:
            log.warning("service account keys: reload failed, keeping the keys in use: %s", e)
            return False
        self._stamp = stamp
        self.keys.signing, self.keys.verifying = fresh.signing, fresh.verifying
        log.info("service account keys reloaded: signing key %s, %d verification key(s)",
                 self.keys.kid, len(self.keys.verifying))
        return True

    async def run(self, *, interval: float = 10.0,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(interval)
            self.reload_if_changed()


# ---------------------------------------------------------------- issuing


@dataclass(frozen=True)
class ObjectRef:
    """A `{name, uid}` the token is bound to (or names: the pod's node)."""

    name: str
    uid: str


@dataclass(frozen=True)
class Binding:
    """What a token is bound to: at most one of pod/secret/node; `node` also rides
    along with a pod-bound token (ServiceAccountTokenPodNodeInfo) without binding it."""

    pod: ObjectRef | None = None
    secret: ObjectRef | None = None
    node: ObjectRef | None = None


def claims(*, issuer: str, namespace: str, sa_name: str, sa_uid: str, audiences: Sequence[str],
           expiration_seconds: int, binding: Binding = Binding(), warnafter: int = 0,
           now: float | None = None, jti: str | None = None) -> dict[str, Any]:
    """The claims of a bound token (claims.go `Claims` + the issuer)."""
    t = int(now if now is not None else time.time())
    private: dict[str, Any] = {"namespace": namespace, "serviceaccount": {"name": sa_name, "uid": sa_uid}}
    if binding.secret is not None and (binding.pod is not None or binding.node is not None):
        raise ValueError("internal error, token can only be bound to one object type")
    for key, ref in (("pod", binding.pod), ("secret", binding.secret), ("node", binding.node)):
        if ref is not None:
            private[key] = {"name": ref.name, "uid": ref.uid} if ref.uid else {"name": ref.name}
    if warnafter:
        private["warnafter"] = t + warnafter
    return {
        "aud": list(audiences),
        "exp": t + expiration_seconds,
        "iat": t,
        "iss": issuer,
        "jti": jti or str(uuid.uuid4()),
        "kubernetes.io": private,
        "nbf": t,
        "sub": SERVICE_ACCOUNT_USER_PREFIX + f"{namespace}:{sa_name}",
    }


class TokenIssuer:
    """Signs bound tokens with the current key (kid header, RS256 or ES*)."""

    def __init__(self, keys: SigningKeys, issuer: str = DEFAULT_ISSUER) -> None:
        self.keys = keys
        self.issuer = issuer

    def sign(self, payload: dict[str, Any]) -> str:
        return jwt.encode(payload, self.keys.signing, algorithm=self.keys.algorithm,
                          headers={"kid": self.keys.kid})

    def issue(self, *, namespace: str, sa_name: str, sa_uid: str, audiences: Sequence[str],
              expiration_seconds: int, binding: Binding = Binding(), warnafter: int = 0,
              now: float | None = None) -> tuple[str, dict[str, Any]]:
        """(token, its claims)."""
        c = claims(issuer=self.issuer, namespace=namespace, sa_name=sa_name, sa_uid=sa_uid,
                   audiences=audiences, expiration_seconds=expiration_seconds, binding=binding,
                   warnafter=warnafter, now=now)
        return self.sign(c), c


# ---------------------------------------------------------------- verifying


def bearer_token(headers: Any) -> str | None:
    """The request's `Authorization: Bearer` token, or None."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def unverified_claims(token: str) -> dict[str, Any] | None:
    """A compact JWS's payload, NOT verified (only to pick the authenticator that
    knows its issuer), or None when `token` is no JWT."""
    if token.lstrip().startswith("{"):
        return None
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: a payload nested past Python's recursion limit (an unauthenticated
        # client's `[[[[...` was a 500 with a traceback; PyJWT guards its own decoding alike).
        return None
    return payload if isinstance(payload, dict) else None


def unverified_header(token: str) -> dict[str, Any]:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return {}
    return header if isinstance(header, dict) else {}


def audiences_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [a for a in value if isinstance(a, str)]
    return []


# An async getter of a core/v1 object: (plural, namespace or "", name) -> object or None.
ObjectGetter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]


def store_getter(store: Store) -> ObjectGetter:
    """Objects read from the store at each call (exact: a deletion counts at once)."""

    async def get(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await store.get(meta.store_key("", plural, namespace or None, name))
        except KeyNotFound:
            return None

    return get


def _deleted_before(obj: dict[str, Any], cutoff: float) -> bool:
    t = meta.parse_epoch((obj.get("metadata") or {}).get("deletionTimestamp"))
    return t is not None and t < cutoff


def _uid(obj: dict[str, Any]) -> str:
    uid = (obj.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else ""


def _ref(private: dict[str, Any], key: str) -> dict[str, str] | None:
    ref = private.get(key)
    if not isinstance(ref, dict):
        return None
    return {"name": str(ref.get("name") or ""), "uid": str(ref.get("uid") or "")}


@dataclass(frozen=True)
class Authenticated:
    user: UserInfo
    audiences: list[str]


class ServiceAccountTokenAuthenticator:
    """Bound ServiceAccount tokens of this cluster's issuer(s) (see the module doc)."""

    def __init__(self, keys: SigningKeys, get: ObjectGetter, *, issuers: Sequence[str] = (DEFAULT_ISSUER,),
                 api_audiences: Sequence[str] = (), clock: Callable[[], float] = time.time) -> None:
        self.keys = keys
        self.get = get
        # A tuple, not a set: an unverified `iss` may be any JSON value, and a list or
        # map is unhashable (`[] in set()` raised TypeError: a 500 for a garbage token).
        self.issuers = tuple(dict.fromkeys(issuers))
        self.api_audiences = list(api_audiences or issuers[:1])
        self.clock = clock

    async def authenticate(self, creds: Credentials) -> UserInfo | None:
        token = bearer_token(creds.headers)
        if token is None:
            return None
        result = await self.authenticate_token(token)
        return result.user if result is not None else None

    async def authenticate_token(self, token: str, audiences: Sequence[str] | None = None) -> Authenticated | None:
        """None: not a token of our issuer.  AuthenticationError: ours, and not valid."""
        peek = unverified_claims(token)
        if peek is None or peek.get("iss") not in self.issuers:
            return None
        header = unverified_header(token)
        alg = header.get("alg")
        kid = header.get("kid") if isinstance(header.get("kid"), str) else ""
        keys = self.keys.keys_for(kid)
        if not keys:
            raise AuthenticationError("invalid signature, no keys found")
        payload: dict[str, Any] | None = None
        errs: list[str] = []
        for key in keys:
            if alg != algorithm_for(key):
                errs.append(f"unexpected signature algorithm {alg!r}")
                continue
            try:
                payload = jwt.decode(token, key, algorithms=[algorithm_for(key)],
                                     options={"verify_signature": True, "verify_exp": False,
                                              "verify_nbf": False, "verify_iat": False,
                                              "verify_aud": False, "verify_iss": False})
                break
            except jwt.InvalidSignatureError:
                errs.append("error in cryptographic primitive")
            except jwt.PyJWTError as e:
                errs.append(str(e))
        if payload is None:
            raise AuthenticationError("; ".join(dict.fromkeys(errs)) or "invalid bearer token")
        if payload.get("iss") not in self.issuers:
            raise AuthenticationError(f'token issuer "{payload.get("iss")}" is invalid')
        token_auds = audiences_of(payload.get("aud")) or list(self.api_audiences)
        wanted = list(audiences or self.api_audiences)
        auds = [a for a in token_auds if a in wanted]
        if not auds and self.api_audiences:
            raise AuthenticationError(f"token audiences {json.dumps(token_auds)} is invalid for the target "
                                      f"audiences {json.dumps(wanted)}")
        user = await self.validate(payload)
        return Authenticated(user, auds)

    async def validate(self, c: dict[str, Any]) -> UserInfo:
        """claims.go `Validate`: times, then the objects the token names still exist."""
        now = self.clock()
        exp, nbf, iat = c.get("exp"), c.get("nbf"), c.get("iat")
        if isinstance(exp, int | float) and now - LEEWAY > exp:
            raise AuthenticationError("service account token has expired")
        if isinstance(nbf, int | float) and now + LEEWAY < nbf:
            raise AuthenticationError("service account token is not valid yet")
        if isinstance(iat, int | float) and now + LEEWAY < iat:
            raise AuthenticationError("service account token is issued in the future")
        private = c.get("kubernetes.io")
        if not isinstance(private, dict):
            raise AuthenticationError("service account token claims could not be validated due to "
                                      "unexpected private claim")
        namespace = str(private.get("namespace") or "")
        sa = _ref(private, "serviceaccount") or {"name": "", "uid": ""}
        cutoff = now - LEEWAY
        account = await self.get("serviceaccounts", namespace, sa["name"])
        if account is None:
            raise AuthenticationError(f'serviceaccounts "{sa["name"]}" not found')
        if _uid(account) != sa["uid"]:
            raise AuthenticationError(f"service account UID ({_uid(account)}) does not match claim ({sa['uid']})")
        if _deleted_before(account, cutoff):
            raise AuthenticationError(f"service account {namespace}/{sa['name']} has been deleted")
        secret_ref, pod_ref, node_ref = _ref(private, "secret"), _ref(private, "pod"), _ref(private, "node")
        if secret_ref is not None:
            secret = await self.get("secrets", namespace, secret_ref["name"])
            if secret is None:
                raise AuthenticationError("service account token has been invalidated")
            if _uid(secret) != secret_ref["uid"]:
                raise AuthenticationError(f"secret UID ({_uid(secret)}) does not match service account "
                                          f"secret ref claim ({secret_ref['uid']})")
            if _deleted_before(secret, cutoff):
                raise AuthenticationError("service account token has been invalidated")
        extra: dict[str, list[str]] = {}
        if pod_ref is not None:
            pod = await self.get("pods", namespace, pod_ref["name"])
            if pod is None:
                raise AuthenticationError("service account token has been invalidated")
            if _uid(pod) != pod_ref["uid"]:
                raise AuthenticationError(f"pod UID ({_uid(pod)}) does not match service account pod "
                                          f"ref claim ({pod_ref['uid']})")
            if _deleted_before(pod, cutoff):
                raise AuthenticationError("service account token has been invalidated")
            extra[POD_NAME_KEY], extra[POD_UID_KEY] = [pod_ref["name"]], [pod_ref["uid"]]
        if node_ref is not None:
            if pod_ref is None:  # bound to the node itself: it must still exist
                node = await self.get("nodes", "", node_ref["name"])
                if node is None:
                    raise AuthenticationError("service account token has been invalidated")
                if _uid(node) != node_ref["uid"]:
                    raise AuthenticationError(f"node UID ({_uid(node)}) does not match service account "
                                              f"node ref claim ({node_ref['uid']})")
                if _deleted_before(node, cutoff):
                    raise AuthenticationError("service account token has been invalidated")
            extra[NODE_NAME_KEY] = [node_ref["name"]]
            if node_ref["uid"]:
                extra[NODE_UID_KEY] = [node_ref["uid"]]
        jti = c.get("jti")
        if isinstance(jti, str) and jti:
            extra[CREDENTIAL_ID_KEY] = [f"JTI={jti}"]
        return UserInfo(
            name=SERVICE_ACCOUNT_USER_PREFIX + f"{namespace}:{sa['name']}",
            uid=sa["uid"],
            groups=(SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}"),
            extra=extra,
        )
