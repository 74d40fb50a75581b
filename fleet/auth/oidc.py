"""OIDC ID tokens of an external identity provider: human users, kube-apiserver's `--oidc-*`.

The provider is named by `--oidc-issuer-url` (https).  Its discovery document
(`<issuer>/.well-known/openid-configuration`, whose `issuer` must be exactly that
URL) gives `jwks_uri`; the JSON Web Key Set there holds the keys ID tokens are
signed with.  Both are fetched with httpx, trusting `--oidc-ca-file` (else the
system roots), by `OIDCKeys`:

* at start and then every `refresh_interval` (so keys rotated at the issuer are
  picked up, and retired ones dropped), in a background task;
* on demand when a token names a `kid` not in the cache (the issuer just rotated),
  at most once per `min_refresh_interval` so garbage kids cannot make the server
  hammer the provider.

`OIDCAuthenticator` then follows k8s.io/apiserver's oidc plugin and go-oidc:
a bearer token that is not a JWT or whose (unverified) `iss` is not the issuer is
None (another authenticator may know it); otherwise the signature (an allowed
`--oidc-signing-algs` algorithm, a key of the set), `iss`, `aud` containing
`--oidc-client-id`, `exp`, `nbf` and `iat` (with leeway), `--oidc-required-claim`s
and `email_verified` (when the username claim is `email`) must all hold, or the
request is a 401 (the reason goes to the log).

Username: the `--oidc-username-claim` (default `sub`), prefixed by
`--oidc-username-prefix`; without a prefix every claim but `email` is prefixed with
`<issuer-url>#`, and the prefix `-` means none.  Groups: `--oidc-groups-claim`, a
string or a list of strings, each prefixed with `--oidc-groups-prefix`.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import trio

from fleet.auth import AuthenticationError, Credentials, UserInfo
from fleet.auth.serviceaccount import bearer_token, unverified_claims, unverified_header

log = logging.getLogger(__name__)

SUPPORTED_ALGS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512")
# go-oidc tolerates this much clock skew on nbf; exp is checked as is, iat like nbf here.
NBF_LEEWAY = 5 * 60


@dataclass
class OIDCConfig:
    """kube-apiserver's --oidc-* flags."""

    issuer_url: str
    client_id: str
    username_claim: str = "sub"
    username_prefix: str | None = None  # None: not given (see `effective_username_prefix`)
    groups_claim: str = ""
    groups_prefix: str = ""
    ca_file: str = ""
    required_claims: dict[str, str] = field(default_factory=dict)
    signing_algs: tuple[str, ...] = ("RS256",)
    refresh_interval: float = 300.0
    min_refresh_interval: float = 10.0

    def validate(self) -> list[str]:
        """What is wrong with the flags (kube-apiserver's option validation)."""
        out = []
        if not self.issuer_url.startswith("https://"):
            out.append(f"--oidc-issuer-url ({self.issuer_url!r}) has invalid scheme, require 'https'")
        if not self.client_id:
            out.append("--oidc-client-id must be set when --oidc-issuer-url is")
        if not self.username_claim:
            out.append("--oidc-username-claim must not be empty")
        bad = [a for a in self.signing_algs if a not in SUPPORTED_ALGS]
        if bad or not self.signing_algs:
            out.append(f"--oidc-signing-algs: unsupported algorithm(s) {', '.join(bad) or '(none)'}; "
                       f"supported: {', '.join(SUPPORTED_ALGS)}")
        return out

    @property
    def effective_username_prefix(self) -> str:
        if self.username_prefix == "-":
            return ""
        if self.username_prefix is None or self.username_prefix == "":
            # Legacy flag behaviour: every claim but email is prefixed with the issuer.
            return "" if self.username_claim == "email" else self.issuer_url + "#"
        return self.username_prefix


def parse_required_claims(values: list[str]) -> dict[str, str]:
    """`--oidc-required-claim key=value` (repeatable) as a dict; ValueError when malformed."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--oidc-required-claim {item!r}: expected key=value")
        out[key] = value
    return out


def ssl_context(ca_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if ca_file:
        ctx = ssl.create_default_context(cafile=ca_file)
    return ctx


class OIDCKeys:
    """The provider's signing keys by kid, fetched and refreshed (see the module doc)."""

    def __init__(self, cfg: OIDCConfig, *, clock: Callable[[], float] = time.monotonic,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.transport = transport
        self.keys: dict[str, Any] = {}  # kid -> pyjwt PyJWK
        self.loaded = False
        self.last_fetch: float | None = None
        self.fetches = 0
        self._lock = trio.Lock()

    async def _get_json(self, client: httpx.AsyncClient, url: str) -> Any:
        resp = await client.get(url, headers={"Accept": "application/json"})
        if resp.status_code != 200:
            raise ValueError(f"{url}: {resp.status_code} {resp.reason_phrase}")
        return resp.json()

    async def fetch(self) -> None:
        """Discovery document, then the key set; replaces the cache (raises on failure)."""
        self.last_fetch = self.clock()
        self.fetches += 1
        issuer = self.cfg.issuer_url
        kwargs: dict[str, Any] = {"timeout": 10.0}
        if self.transport is not None:
            kwargs["transport"] = self.transport
        else:
            kwargs["verify"] = ssl_context(self.cfg.ca_file)
        async with httpx.AsyncClient(**kwargs) as client:
            doc = await self._get_json(client, issuer.rstrip("/") + "/.well-known/openid-configuration")
            if not isinstance(doc, dict) or doc.get("issuer") != issuer:
                got = doc.get("issuer") if isinstance(doc, dict) else None
                raise ValueError(f'oidc: issuer did not match the issuer returned by provider, expected '
                                 f'"{issuer}" got "{got}"')
            jwks_uri = doc.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri:
                raise ValueError("oidc: the provider's discovery document has no jwks_uri")
            jwks = await self._get_json(client, jwks_uri)
        keys: dict[str, Any] = {}
        for entry in (jwks.get("keys") if isinstance(jwks, dict) else None) or []:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except (jwt.PyJWTError, ValueError, TypeError) as e:
                log.debug("oidc: skipping a key of %s: %s", jwks_uri, e)
                continue
            keys[str(entry.get("kid") or "")] = key
        if not keys:
            raise ValueError(f"oidc: no usable signing keys at {jwks_uri}")
        self.keys, self.loaded = keys, True

    async def refresh(self, *, force: bool = False) -> bool:
        """Fetch again unless one was done less than min_refresh_interval ago (unless
        `force`); True if a fetch happened and succeeded."""
        async with self._lock:
            if (not force and self.last_fetch is not None
                    and self.clock() - self.last_fetch < self.cfg.min_refresh_interval):
                return False
            try:
                await self.fetch()
            except (httpx.HTTPError, ValueError, OSError) as e:
                log.warning("oidc: fetching the keys of %s failed: %s", self.cfg.issuer_url, e)
                return False
            return True

    async def for_kid(self, kid: str) -> list[Any]:
        """The keys that may have signed a token with this kid (all without one),
        refreshing (rate-limited) when the kid is unknown."""
        if not self.loaded or (kid and kid not in self.keys):
            await self.refresh()
        if not self.loaded:
            raise AuthenticationError("oidc: authenticator not initialized")
        if kid:
            return [self.keys[kid]] if kid in self.keys else []
        return list(self.keys.values())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch now (a provider that is down is retried, never fatal: the server does not
        wait for it, and a token arriving meanwhile waits for this fetch) and keep refreshing."""
        task_status.started()
        await self.refresh(force=True)
        while True:
            await trio.sleep(self.cfg.refresh_interval if self.loaded else max(self.cfg.min_refresh_interval, 1.0))
            await self.refresh(force=True)


def _claim_str(claims: dict[str, Any], name: str, what: str) -> str:
    if name not in claims:
        raise AuthenticationError(f'oidc: parse {what} claims "{name}": claim not present')
    value = claims[name]
    if not isinstance(value, str):
        raise AuthenticationError(f'oidc: parse {what} claims "{name}": json: cannot unmarshal '
                                  f"{type(value).__name__} into Go value of type string")
    return value


class OIDCAuthenticator:
    """ID tokens of one OIDC provider (see the module doc)."""

    def __init__(self, cfg: OIDCConfig, keys: OIDCKeys | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.keys = keys or OIDCKeys(cfg)
        self.clock = clock

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.keys.run(task_status=task_status)

    async def authenticate(self, creds: Credentials) -> UserInfo | None:
        token = bearer_token(creds.headers)
        if token is None:
            return None
        return await self.verify(token)

    async def verify(self, token: str) -> UserInfo | None:
        peek = unverified_claims(token)
        if peek is None or peek.get("iss") != self.cfg.issuer_url:
            return None
        header = unverified_header(token)
        alg = header.get("alg")
        if alg not in self.cfg.signing_algs:
            raise AuthenticationError(f"oidc: id token signed with unsupported algorithm, expected "
                                      f"{json.dumps(list(self.cfg.signing_algs))} got {json.dumps(alg)}")
        kid = header.get("kid") if isinstance(header.get("kid"), str) else ""
        keys = await self.keys.for_kid(kid)
        if not keys:
            raise AuthenticationError("oidc: verify token: failed to verify id token signature: no key "
                                      f"with kid {json.dumps(kid)} in the provider's key set")
        claims: dict[str, Any] | None = None
        for key in keys:
            try:
                claims = jwt.decode(token, key.key, algorithms=[alg],
                                    options={"verify_signature": True, "verify_exp": False,
                                             "verify_nbf": False, "verify_iat": False,
                                             "verify_aud": False, "verify_iss": False})
                break
            except jwt.PyJWTError:
                continue
        if claims is None:
            raise AuthenticationError("oidc: verify token: failed to verify signature: failed to verify "
                                      "id token signature")
        return self.user_from(claims)

    def user_from(self, c: dict[str, Any]) -> UserInfo:
        """The claims checks of go-oidc and the apiserver plugin, then the user."""
        cfg = self.cfg
        if c.get("iss") != cfg.issuer_url:
            raise AuthenticationError(f'oidc: id token issued by a different provider, expected '
                                      f'"{cfg.issuer_url}" got "{c.get("iss")}"')
        aud = c.get("aud")
        auds = [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)] \
            if isinstance(aud, list) else []
        if cfg.client_id not in auds:
            raise AuthenticationError(f'oidc: expected audience "{cfg.client_id}" got {json.dumps(auds)}')
        now = self.clock()
        exp = c.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise AuthenticationError("oidc: token has no valid exp claim")
        if now > exp:
            raise AuthenticationError(f"oidc: token is expired (Token Expiry: {_utc(exp)})")
        nbf = c.get("nbf")
        if isinstance(nbf, int | float) and now + NBF_LEEWAY < nbf:
            raise AuthenticationError(f"oidc: current time {_utc(now)} before the nbf (not before) time: "
                                      f"{_utc(nbf)}")
        iat = c.get("iat")
        if isinstance(iat, int | float) and now + NBF_LEEWAY < iat:
            raise AuthenticationError(f"oidc: token issued in the future (iat {_utc(iat)})")
        for key, want in cfg.required_claims.items():
            if key not in c:
                raise AuthenticationError(f"oidc: required claim {key} not present in ID token")
            if c[key] != want:
                raise AuthenticationError(f"oidc: required claim {key} value does not match. "
                                          f"Got = {c[key]}, want = {want}")
        username = _claim_str(c, cfg.username_claim, "username")
        if cfg.username_claim == "email" and "email_verified" in c:
            if not isinstance(c["email_verified"], bool):
                raise AuthenticationError("oidc: parse 'email_verified' claim: not a boolean")
            if not c["email_verified"]:
                raise AuthenticationError("oidc: email not verified")
        groups: list[str] = []
        if cfg.groups_claim and cfg.groups_claim in c:
            g = c[cfg.groups_claim]
            if isinstance(g, str):
                groups = [g]
            elif isinstance(g, list) and all(isinstance(x, str) for x in g):
                groups = list(g)
            else:
                raise AuthenticationError(f'oidc: parse groups claim "{cfg.groups_claim}": '
                                          "expected a string or an array of strings")
        return UserInfo(name=cfg.effective_username_prefix + username,
                        groups=tuple(cfg.groups_prefix + g for g in groups))


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(t))
