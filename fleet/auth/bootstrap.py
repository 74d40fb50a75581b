"""Bootstrap (join) tokens: their format, their Secrets, the authenticator, the
cluster-info ConfigMap and its JWS signatures.

A bootstrap token is Kubernetes' `[a-z0-9]{6}.[a-z0-9]{16}`: a public id and a
secret.  It lives as a Secret `kube-system/bootstrap-token-<id>` of type
`bootstrap.kubernetes.io/token` (data token-id, token-secret, expiration,
usage-bootstrap-authentication, usage-bootstrap-signing, auth-extra-groups,
description), exactly as kubeadm writes it, so `fleet token` and kubeadm-made
tokens are interchangeable.  Deleting the Secret revokes the token; the token
cleaner (fleet/controllers/tokencleaner.py) deletes expired ones.

`BootstrapTokenAuthenticator` (kube-apiserver's --enable-bootstrap-token-auth):
a bearer token of that shape is looked up by id; a wrong secret, an expired or
deleted Secret, or one not meant for authentication is an AuthenticationError
(401); otherwise the request is `system:bootstrap:<id>` in `system:bootstrappers`
plus the token's extra groups (only `system:bootstrappers:*` ones are allowed).

cluster-info (`kube-public/cluster-info`) holds a kubeconfig with the server URL
and the cluster CA and no credentials.  The bootstrap signer
(fleet/controllers/bootstrapsigner.py) adds `jws-kubeconfig-<id>` per signing
token: a detached JWS (HS256, key = the token secret, kid = the token id), as
kubeadm's discovery expects, so a node that only knows the token can check that
the CA it is shown comes from someone who knows the token too.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import secrets
import string
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from fleet.auth import BOOTSTRAPPERS_GROUP, AuthenticationError, Credentials, UserInfo

log = logging.getLogger(__name__)

NAMESPACE = "kube-system"
SECRET_TYPE = "bootstrap.kubernetes.io/token"
SECRET_PREFIX = "bootstrap-token-"
USER_PREFIX = "system:bootstrap:"
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
TOKEN_ID_RE = re.compile(r"^[a-z0-9]{6}$")
EXTRA_GROUP_RE = re.compile(r"^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$")
USAGES = ("authentication", "signing")
USAGE_PREFIX = "usage-bootstrap-"
# kubeadm's defaults (`kubeadm token create`).
DEFAULT_TTL = dt.timedelta(hours=24)
DEFAULT_GROUPS = ("system:bootstrappers:kubeadm:default-node-token",)

# cluster-info (kubeadm's bootstrapapi constants).
CLUSTER_INFO_NAMESPACE = "kube-public"
CLUSTER_INFO_NAME = "cluster-info"
# The CA bundles that verify client certificates, as kube-apiserver publishes them
# (kube-system/extension-apiserver-authentication): a joined node's agent API
# verifies the API server's client certificate against `client-ca-file`.
CLIENT_CA_NAMESPACE = "kube-system"
CLIENT_CA_NAME = "extension-apiserver-authentication"
CLIENT_CA_KEY = "client-ca-file"
REQUESTHEADER_CA_KEY = "requestheader-client-ca-file"
KUBECONFIG_KEY = "kubeconfig"
JWS_PREFIX = "jws-kubeconfig-"

_ALPHABET = string.ascii_lowercase + string.digits


def generate_token() -> str:
    """A fresh random token `<6>.<16>` (kubeadm's GenerateBootstrapToken)."""
    pick = lambda n: "".join(secrets.choice(_ALPHABET) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"


def parse_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a token of the bootstrap shape, else None."""
    m = TOKEN_RE.match(token.strip())
    return (m.group(1), m.group(2)) if m else None


def secret_name(token_id: str) -> str:
    return SECRET_PREFIX + token_id


def format_time(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def validate_groups(groups: Iterable[str]) -> list[str]:
    """The problems with extra groups (kubeadm's ValidateGroups)."""
    return [f'group "{g}" must match the regular expression {EXTRA_GROUP_RE.pattern}'
            for g in groups if not EXTRA_GROUP_RE.match(g)]


def validate_usages(usages: Iterable[str]) -> list[str]:
    return [f'invalid bootstrap token usage string: {u}, valid usage options: {", ".join(USAGES)}'
            for u in usages if u not in USAGES]


def token_secret(token: str, *, ttl: dt.timedelta | None = DEFAULT_TTL, description: str = "",
                 usages: Iterable[str] = USAGES, groups: Iterable[str] = DEFAULT_GROUPS,
                 now: dt.datetime | None = None) -> dict[str, Any]:
    """The Secret that stores `token` (kubeadm's BootstrapTokenToSecret).  A ttl of
    None or 0 never expires.  Raises ValueError for a malformed token, usage or group."""
    parsed = parse_token(token)
    if parsed is None:
        raise ValueError(f'the bootstrap token "{token}" was not of the form "{TOKEN_RE.pattern}"')
    usages, groups = list(usages), list(groups)
    problems = validate_usages(usages) + validate_groups(groups)
    if problems:
        raise ValueError("; ".join(problems))
    token_id, token_sec = parsed
    data = {"token-id": token_id, "token-secret": token_sec}
    if description:
        data["description"] = description
    if ttl:
        data["expiration"] = format_time((now or dt.datetime.now(dt.UTC)) + ttl)
    for u in usages:
        data[USAGE_PREFIX + u] = "true"
    if groups:
        data["auth-extra-groups"] = ",".join(groups)
    return {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
            "metadata": {"name": secret_name(token_id), "namespace": NAMESPACE},
            "data": {k: _b64(v) for k, v in data.items()}}


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    """The Secret's data, decoded (undecodable values are left out)."""
    out: dict[str, str] = {}
    for k, v in ((secret.get("data") or {}) if isinstance(secret.get("data"), dict) else {}).items():
        try:
            out[str(k)] = base64.b64decode(str(v), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            continue
    return out


def expiration(data: dict[str, str]) -> dt.datetime | None:
    """When the token expires (None: never).  An unparsable expiration counts as
    already expired (kube's bootstrap secret util refuses such tokens)."""
    raw = data.get("expiration")
    if not raw:
        return None
    try:
        t = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def is_expired(data: dict[str, str], now: dt.datetime | None = None) -> bool:
    exp = expiration(data)
    return exp is not None and exp <= (now or dt.datetime.now(dt.UTC))


def is_bootstrap_secret(secret: Any) -> bool:
    return (isinstance(secret, dict) and secret.get("type") == SECRET_TYPE
            and (secret.get("metadata") or {}).get("namespace") == NAMESPACE
            and str((secret.get("metadata") or {}).get("name") or "").startswith(SECRET_PREFIX))


def extra_groups(data: dict[str, str]) -> list[str]:
    return [g.strip() for g in (data.get("auth-extra-groups") or "").split(",") if g.strip()]


@dataclass(frozen=True)
class TokenInfo:
    """A bootstrap token Secret as `fleet token list` shows it."""

    token_id: str
    token_secret: str
    expires: dt.datetime | None
    usages: list[str]
    description: str
    groups: list[str]


def token_info(secret: dict[str, Any]) -> TokenInfo | None:
    if not is_bootstrap_secret(secret):
        return None
    data = secret_data(secret)
    tid = data.get("token-id") or str(secret["metadata"]["name"])[len(SECRET_PREFIX):]
    return TokenInfo(tid, data.get("token-secret", ""), expiration(data),
                     [u for u in USAGES if data.get(USAGE_PREFIX + u) == "true"],
                     data.get("description", ""), extra_groups(data))


def check_token(secret: dict[str, Any] | None, token_id: str, token_sec: str, *,
                usage: str = "authentication", now: dt.datetime | None = None) -> dict[str, str]:
    """The decoded data of the Secret if it makes `<id>.<secret>` a valid token for
    `usage`; else AuthenticationError saying why (for the log, never the client)."""
    if secret is None:
        raise AuthenticationError(f"bootstrap token {token_id}: no secret {NAMESPACE}/{secret_name(token_id)}")
    if secret.get("type") != SECRET_TYPE:
        raise AuthenticationError(f"bootstrap token {token_id}: secret has type {secret.get('type')!r}, "
                                  f"not {SECRET_TYPE}")
    if (secret.get("metadata") or {}).get("deletionTimestamp"):
        raise AuthenticationError(f"bootstrap token {token_id}: secret is being deleted")
    data = secret_data(secret)
    if not hmac.compare_digest(data.get("token-secret", "").encode(), token_sec.encode()):
        raise AuthenticationError(f"bootstrap token {token_id}: wrong token secret")
    if data.get("token-id") != token_id:
        raise AuthenticationError(f"bootstrap token {token_id}: token id does not match the secret's")
    if is_expired(data, now):
        raise AuthenticationError(f"bootstrap token {token_id}: expired at {data.get('expiration')}")
    if data.get(USAGE_PREFIX + usage) != "true":
        raise AuthenticationError(f"bootstrap token {token_id}: not marked for {usage} "
                                  f"({USAGE_PREFIX}{usage} is not \"true\")")
    return data


def bootstrap_user(token_id: str, data: dict[str, str]) -> UserInfo:
    """`system:bootstrap:<id>` in system:bootstrappers and the token's valid extra groups."""
    groups = [BOOTSTRAPPERS_GROUP]
    for g in extra_groups(data):
        if EXTRA_GROUP_RE.match(g) and g not in groups:
            groups.append(g)
        elif not EXTRA_GROUP_RE.match(g):
            log.warning("bootstrap token %s: ignoring extra group %r (only system:bootstrappers:* "
                        "groups may be added)", token_id, g)
    return UserInfo(USER_PREFIX + token_id, groups=tuple(groups))


SecretLookup = Callable[[str], Awaitable[dict[str, Any] | None]]


class BootstrapTokenAuthenticator:
    """Bearer tokens of the bootstrap shape, checked against their Secret.

    `lookup(name)` returns the Secret `kube-system/<name>` (or None): a watch-fed
    cache with a store read on a miss (`SecretSource`), so a token created a moment
    ago works at once while the common case costs no store read."""

    def __init__(self, lookup: SecretLookup, *, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.lookup = lookup
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))

    async def authenticate(self, creds: Credentials) -> UserInfo | None:
        scheme, _, token = creds.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        parsed = parse_token(token)
        if parsed is None:
            return None  # not ours: another authenticator's token
        token_id, token_sec = parsed
        secret = await self.lookup(secret_name(token_id))
        data = check_token(secret, token_id, token_sec, now=self.clock())
        return bootstrap_user(token_id, data)


class SecretSource:
    """kube-system Secrets for the authenticator: a `WatchCache` (fed by the server's
    store watch) and the store itself on a miss."""

    def __init__(self, store: Any) -> None:
        from fleet.api import meta
        from fleet.store.watchcache import WatchCache

        self.store = store
        self.prefix = meta.store_key("", "secrets", NAMESPACE)
        self.cache = WatchCache(self.prefix)

    async def run(self, *, task_status: Any = None) -> None:
        import trio

        await self.cache.run(self.store, task_status=task_status or trio.TASK_STATUS_IGNORED)

    async def __call__(self, name: str) -> dict[str, Any] | None:
        from fleet.store import KeyNotFound

        cached = self.cache.get(f"{NAMESPACE}/{name}")
        if cached is not None:
            return cached
        try:
            return await self.store.get(self.prefix + name)
        except KeyNotFound:
            return None


# --------------------------------------------------------------------------------- JWS


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def compute_detached_signature(content: str, token_id: str, token_sec: str) -> str:
    """kubeadm's jws.ComputeDetachedSignature: a compact JWS (HS256, kid = token id,
    key = token secret) of `content` with the payload left out: `header..signature`."""
    header = _b64url(json.dumps({"alg": "HS256", "kid": token_id}, separators=(",", ":")).encode())
    signing_input = f"{header}.{_b64url(content.encode())}".encode()
    sig = hmac.new(token_sec.encode(), signing_input, hashlib.sha256).digest()
    return f"{header}..{_b64url(sig)}"


def verify_detached_signature(content: str, jws: str, token_id: str, token_sec: str) -> bool:
    """Whether `jws` is a detached HS256 signature of `content` by this token."""
    parts = jws.split(".")
    if len(parts) != 3 or parts[1] != "":
        return False
    try:
        header = json.loads(_unb64url(parts[0]))
        sig = _unb64url(parts[2])
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError)
        return False
    if not isinstance(header, dict) or header.get("alg") != "HS256" or header.get("kid") != token_id:
        return False
    signing_input = f"{parts[0]}.{_b64url(content.encode())}".encode()
    expected = hmac.new(token_sec.encode(), signing_input, hashlib.sha256).digest()
    return hmac.compare_digest(expected, sig)


# ------------------------------------------------------------------------- cluster-info


def cluster_info_kubeconfig(server_url: str, ca_pem: bytes) -> str:
    """The kubeconfig cluster-info carries: one cluster, no credentials (kubeadm's)."""
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "", "cluster": {
               "certificate-authority-data": base64.b64encode(ca_pem).decode(),
               "server": server_url}}],
           "contexts": [], "current-context": "", "preferences": {}, "users": []}
    return yaml.safe_dump(doc, sort_keys=False)


def parse_cluster_info_kubeconfig(text: str) -> tuple[str, bytes]:
    """(server URL, CA PEM) from cluster-info's kubeconfig; ValueError if unusable."""
    try:
        doc = yaml.safe_load(text)
        cluster = doc["clusters"][0]["cluster"]
        return str(cluster["server"]), base64.b64decode(cluster["certificate-authority-data"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"cluster-info holds no usable kubeconfig: {e}") from None


def ca_cert_hash(ca_pem: bytes) -> str:
    """`sha256:<hex>` of the CA certificate's SubjectPublicKeyInfo (kubeadm's
    --discovery-token-ca-cert-hash)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(ca_pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def cluster_info_configmap(server_url: str, ca_pem: bytes) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CLUSTER_INFO_NAME, "namespace": CLUSTER_INFO_NAMESPACE},
            "data": {KUBECONFIG_KEY: cluster_info_kubeconfig(server_url, ca_pem)}}


async def ensure_cluster_info(store: Any, registry: Any, server_url: str, ca_pem: bytes) -> None:
    """Create `kube-public/cluster-info`, or refresh its kubeconfig when the server URL
    or the CA changed (kubeadm's `bootstrap-token` phase; the signatures are the
    bootstrap signer's and are dropped with a changed kubeconfig, it re-signs)."""
    await ensure_configmap(store, registry, CLUSTER_INFO_NAMESPACE, CLUSTER_INFO_NAME,
                           {KUBECONFIG_KEY: cluster_info_kubeconfig(server_url, ca_pem)},
                           same=lambda have: have.get(KUBECONFIG_KEY) == cluster_info_kubeconfig(
                               server_url, ca_pem))


async def ensure_configmap(store: Any, registry: Any, namespace: str, name: str, data: dict[str, str],
                           same: Any = None) -> None:
    """Create the ConfigMap `namespace/name` with `data`, or replace its data when it
    differs (`same(have_data)` decides what counts as unchanged; default: equal).
    The server's own bookkeeping objects: written through the store at start."""
    from fleet.store import KeyExists, KeyNotFound, RevisionConflict

    info = registry.get("", "v1", "configmaps")
    key = info.key(namespace, name)
    unchanged = same or (lambda have: have == data)
    for _ in range(5):
        try:
            cur = await store.get(key)
        except KeyNotFound:
            obj = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "namespace": namespace}, "data": dict(data)}
            try:
                await store.create(key, obj)
                return
            except KeyExists:
                continue
        if unchanged(cur.get("data") or {}):
            return
        cur["data"] = dict(data)
        try:
            await store.update(key, cur, expected_revision=int(cur["metadata"]["resourceVersion"]))
            return
        except RevisionConflict:
            continue
    raise RuntimeError(f"configmap {namespace}/{name}: kept conflicting with other writers")


def desired_signatures(kubeconfig: str, tokens: Iterable[dict[str, Any]],
                       now: dt.datetime | None = None) -> dict[str, str]:
    """`jws-kubeconfig-<id>` → signature for each valid signing token (the bootstrap
    signer's getTokens + signing): not expired, usage-bootstrap-signing true."""
    out: dict[str, str] = {}
    for secret in tokens:
        if not is_bootstrap_secret(secret) or (secret.get("metadata") or {}).get("deletionTimestamp"):
            continue
        data = secret_data(secret)
        tid, sec = data.get("token-id", ""), data.get("token-secret", "")
        if not TOKEN_ID_RE.match(tid) or not re.match(r"^[a-z0-9]{16}$", sec):
            continue
        if secret["metadata"]["name"] != secret_name(tid):
            continue
        if is_expired(data, now) or data.get(USAGE_PREFIX + "signing") != "true":
            continue
        out[JWS_PREFIX + tid] = compute_detached_signature(kubeconfig, tid, sec)
    return out


def signed_data(configmap: dict[str, Any], tokens: Iterable[dict[str, Any]],
                now: dt.datetime | None = None) -> dict[str, str] | None:
    """cluster-info's data as the bootstrap signer wants it, or None when it already
    is (or there is no kubeconfig to sign)."""
    data = dict(configmap.get("data") or {})
    kubeconfig = data.get(KUBECONFIG_KEY)
    if not isinstance(kubeconfig, str):
        return None
    want = {k: v for k, v in data.items() if not k.startswith(JWS_PREFIX)}
    want.update(desired_signatures(kubeconfig, tokens, now))
    return None if want == data else want
