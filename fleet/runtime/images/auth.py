"""Registry authentication: credentials from pull secrets, challenges, bearer tokens.

A registry says how it wants to be authenticated only when it refuses a request:
`401` with `WWW-Authenticate: Basic realm="..."` or
`WWW-Authenticate: Bearer realm="https://auth/token",service="reg",scope="repository:x:pull"`.
`RegistryAuth.send` makes a request, and on such a challenge retries it once
with Basic credentials or with a bearer token fetched from the realm (with the
Basic credentials when we have some, anonymously otherwise — Docker Hub hands
anonymous pull tokens).  Tokens are cached per (realm, service, scope) until
shortly before they expire.

Credentials come from Kubernetes `imagePullSecrets` (`.dockerconfigjson`); the
matching rule follows the kubelet's keyring: a key may carry a scheme, a path
and a `*.` wildcard in the host, and Docker Hub answers to several names.
"""

from __future__ import annotations

import base64
import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from fleet.runtime.images.errors import ERR_IMAGE_PULL, ImagePullError

_DOCKER_HUB_NAMES = {
    "docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com",
}
# Tokens without `expires_in` live 60 s per the token spec; renew a little early.
_DEFAULT_TOKEN_TTL = 60.0
_TOKEN_MARGIN = 10.0


@dataclass(frozen=True)
class Credentials:
    """A username and password (or an access token used as the password).

    `identity_token` is an OAuth2 refresh token (Docker's `identitytoken`,
    registries.yaml's `auth.identity_token`): with one, bearer tokens are fetched
    by POSTing it to the token realm instead of sending Basic credentials.
    """

    username: str
    password: str
    identity_token: str = ""

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def __repr__(self) -> str:  # never print secrets into logs or test output
        return (f"Credentials(username={self.username!r}, password=***"
                + (", identity_token=***)" if self.identity_token else ")"))


@dataclass(frozen=True)
class Challenge:
    """One parsed `WWW-Authenticate` challenge: scheme plus its parameters."""

    scheme: str
    params: dict[str, str]


_PARAM_RE = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?')


def parse_challenges(header: str) -> list[Challenge]:
    """Parse `WWW-Authenticate` (RFC 7235): `Bearer realm="...",service="...",scope="..."`.

    Several challenges may share one header (`Basic realm="x", Bearer realm="y"`);
    a token after a comma that is followed by a space and no `=` starts a new one.
    """
    out: list[Challenge] = []
    rest = header.strip()
    while rest:
        m = re.match(r"([A-Za-z][A-Za-z0-9_-]*)(?:\s+|$)", rest)
        if not m:
            break
        scheme = m.group(1).lower()
        rest = rest[m.end():]
        params: dict[str, str] = {}
        while rest:
            pm = _PARAM_RE.match(rest)
            if not pm:
                break
            value = pm.group(2) if pm.group(2) is not None else pm.group(3)
            params[pm.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
            rest = rest[pm.end():].lstrip()
        out.append(Challenge(scheme, params))
        rest = rest.lstrip(", ")
    return out


def _key_host(key: str) -> str:
    """A dockerconfig key reduced to host[:port] (`https://h:5000/v2/` → `h:5000`)."""
    k = key.strip()
    if "://" in k:
        k = urlsplit(k).netloc or k.split("://", 1)[1]
    k = k.split("/", 1)[0]
    return k.lower()


def _same_host(key_host: str, host: str) -> bool:
    host = host.lower()
    if key_host in _DOCKER_HUB_NAMES and host in _DOCKER_HUB_NAMES:
        return True
    if key_host == host:
        return True
    if "*" in key_host:
        # The kubelet's rule: wildcards match one DNS label each, and ports must agree.
        kh, _, kport = key_host.partition(":")
        hh, _, hport = host.partition(":")
        if kport != hport or kh.count(".") != hh.count("."):
            return False
        return fnmatch.fnmatchcase(hh, kh)
    return False


def _entry_credentials(entry: Any) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    user, password = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(password, str) and (user or password):
        return Credentials(user, password)
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            decoded = base64.b64decode(auth, validate=False).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if sep:
            return Credentials(user, password)
    return None


def credentials_for(host: str, docker_config_jsons: Iterable[dict[str, Any]]) -> Credentials | None:
    """The first credentials in `docker_config_jsons` for registry `host`.

    Each element is a decoded `.dockerconfigjson` (`{"auths": {key: entry}}`) or a
    legacy `.dockercfg` (`{key: entry}`); an entry has `username`/`password` or
    `auth` (base64 of `user:password`).  Secrets are searched in order, as the pod
    lists them.
    """
    for cfg in docker_config_jsons:
        if not isinstance(cfg, dict):
            continue
        auths = cfg.get("auths") if isinstance(cfg.get("auths"), dict) else cfg
        # Exact host keys win over wildcards within one secret.
        entries = sorted(auths.items(), key=lambda kv: "*" in kv[0])
        for key, entry in entries:
            if _same_host(_key_host(key), host):
                creds = _entry_credentials(entry)
                if creds is not None:
                    return creds
    return None


def registry_error_message(resp: httpx.Response) -> str:
    """The registry's own words from an error response (`unauthorized: authentication required`)."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    parts: list[str] = []
    if isinstance(doc, dict) and isinstance(doc.get("errors"), list):
        for err in doc["errors"]:
            if not isinstance(err, dict):
                continue
            code = str(err.get("code") or "").lower().replace("_", " ")
            message = str(err.get("message") or "").strip()
            if code and message and message.lower() != code:
                parts.append(f"{code}: {message}")
            elif message or code:
                parts.append(message or code)
    elif isinstance(doc, dict) and isinstance(doc.get("details") or doc.get("error"), str):
        parts.append(str(doc.get("details") or doc.get("error")))
    if parts:
        return "; ".join(parts)
    text = resp.text.strip() if resp.content else ""
    return text[:300] or f"{resp.status_code} {resp.reason_phrase}"


class RegistryAuth:
    """Answers a registry's authentication challenges for one set of credentials."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials
        self._tokens: dict[tuple[str, str, str], tuple[str, float]] = {}
        # What the registry asked for last time, so later requests authenticate up front.
        self._challenge: dict[str, Challenge] = {}

    async def send(
        self, client: httpx.AsyncClient, request: httpx.Request, *, scope: str, stream: bool = False
    ) -> httpx.Response:
        """Send `request`, answering one 401 challenge; returns the final response."""
        host = request.url.netloc.decode()
        known = self._challenge.get(host)
        if known is not None:
            # Authenticate up front with what this host asked for before, for our scope.
            await self._authorize(client, request, known, scope)
        resp = await client.send(request, stream=stream)
        if resp.status_code != 401:
            return resp
        header = resp.headers.get("www-authenticate", "")
        challenges = parse_challenges(header)
        chosen = next((c for c in challenges if c.scheme == "bearer"), None) or next(
            (c for c in challenges if c.scheme == "basic"), None
        )
        basic_ok = self.credentials is not None and bool(
            self.credentials.username or self.credentials.password)
        if chosen is None or (chosen.scheme == "basic" and not basic_ok):
            return resp  # nothing we can answer with: the caller reports the 401
        if known is not None and known == chosen and chosen.scheme == "basic":
            return resp  # we already sent these credentials and they were refused
        await resp.aclose()
        self._challenge[host] = chosen
        retry = client.build_request(
            request.method, request.url, headers=request.headers, content=request.content
        )
        # The challenge names the scope this very request needs; prefer it.
        await self._authorize(
            client, retry, chosen, chosen.params.get("scope") or scope, fresh=True
        )
        return await client.send(retry, stream=stream)

    async def _authorize(
        self,
        client: httpx.AsyncClient,
        request: httpx.Request,
        challenge: Challenge,
        scope: str,
        *,
        fresh: bool = False,
    ) -> None:
        if challenge.scheme == "basic":
            if self.credentials is not None:
                request.headers["Authorization"] = self.credentials.basic_header()
            return
        token = await self.token(client, challenge, scope, fresh=fresh)
        request.headers["Authorization"] = f"Bearer {token}"

    async def token(
        self, client: httpx.AsyncClient, challenge: Challenge, scope: str, *, fresh: bool = False
    ) -> str:
        """A bearer token for `scope` from the challenge's realm (cached until near expiry)."""
        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise ImagePullError(ERR_IMAGE_PULL, f"registry sent an unusable token realm {realm!r}")
        service = challenge.params.get("service", "")
        wanted = scope
        key = (realm, service, wanted)
        cached = self._tokens.get(key)
        if cached is not None and not fresh and cached[1] > trio.current_time():
            return cached[0]
        params = {k: v for k, v in (("service", service), ("scope", wanted)) if v}
        if self.credentials is not None and self.credentials.identity_token:
            # The OAuth2 refresh-token grant of the distribution token spec
            # (what docker and containerd do with an identity token).
            form = {"grant_type": "refresh_token", "client_id": "fleet",
                    "refresh_token": self.credentials.identity_token, **params}
            resp = await client.post(realm, data=form)
        else:
            headers = {}
            if self.credentials is not None:
                headers["Authorization"] = self.credentials.basic_header()
            resp = await client.get(realm, params=params, headers=headers)
        if resp.status_code != 200:
            raise ImagePullError(
                ERR_IMAGE_PULL,
                f"token request to {realm} failed ({resp.status_code}): "
                + registry_error_message(resp),
                status=resp.status_code,
            )
        try:
            doc = resp.json()
        except ValueError:
            doc = {}
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise ImagePullError(ERR_IMAGE_PULL, f"token response from {realm} has no token")
        ttl = doc.get("expires_in")
        ttl = float(ttl) if isinstance(ttl, int | float) and ttl > 0 else _DEFAULT_TOKEN_TTL
        self._tokens[key] = (token, trio.current_time() + max(ttl - _TOKEN_MARGIN, 1.0))
        return token
