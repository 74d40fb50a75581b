"""KMS plugins: where the key-encryption key (KEK) of `kms` v2 providers lives.

The envelope scheme (fleet/store/encryption.py) never sees a KEK: it hands a
data key (DEK) to a plugin and stores what comes back.  One interface, two
in-tree implementations:

* `LocalKeyFile` (`endpoint: file:///path`) — the KEK is a base64 32-byte key in
  a file on this host.  For development: the key sits beside the database.
* `RemoteKMS` (`endpoint: unix:///path.sock` or `https://host[:port][/base]`) — an
  external KMS speaking Fleet's small JSON protocol over HTTP/1.1:

    GET  {base}/v1/status  -> {"healthz": "ok", "version": "v2", "keyID": "<current KEK id>"}
    POST {base}/v1/wrap    {"plaintext": b64(dek)}
                           -> {"ciphertext": b64(wrapped), "keyID": "<KEK id used>"}
    POST {base}/v1/unwrap  {"ciphertext": b64(wrapped), "keyID": "<id>"}
                           -> {"plaintext": b64(dek)}

  Errors are any non-2xx answer (the body's text is quoted in our message).
  With OAuth2 client credentials configured, every call carries
  `Authorization: Bearer <token>`, the token fetched from the token endpoint
  (`grant_type=client_credentials`, client id/secret in HTTP basic auth, RFC 6749
  §4.4) and cached until shortly before its `expires_in`.

Calls are blocking: the store invokes them from its worker threads (reads and
the writer already run there), and only on a DEK cache miss — so rarely.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class KMSError(Exception):
    """A KMS plugin could not do what was asked (unreachable, refused, bad answer)."""


class KMSPlugin(Protocol):
    """What the envelope scheme needs of a KEK holder."""

    def wrap(self, dek: bytes) -> tuple[bytes, str]:
        """Encrypt `dek` under the current KEK: (wrapped, key id)."""
        ...

    def unwrap(self, wrapped: bytes, key_id: str) -> bytes:
        """The DEK `wrapped` (under KEK `key_id`) stands for."""
        ...

    def status(self) -> str:
        """The current KEK's id; raises KMSError when the KMS is not healthy."""
        ...


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: Any, what: str) -> bytes:
    if not isinstance(s, str):
        raise KMSError(f"KMS answer lacks {what}")
    try:
        return base64.b64decode(s, validate=True)
    except ValueError as e:
        raise KMSError(f"KMS answer: {what} is not base64") from e


def read_key_file(path: Path) -> bytes:
    """A 32-byte key: the file holds it base64-encoded (or as 32 raw bytes)."""
    raw = path.read_bytes()
    if len(raw) == 32:
        return raw
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except ValueError as e:
        raise KMSError(f"{path}: not a base64 key") from e
    if len(key) != 32:
        raise KMSError(f"{path}: the key is {len(key)} bytes, expected 32")
    return key


def key_id_of(kek: bytes) -> str:
    """A key's public id: a digest prefix (names the key, reveals nothing)."""
    return "sha256:" + hashlib.sha256(b"fleet-kek-id\0" + kek).hexdigest()[:16]


def seal_with_kek(kek: bytes, dek: bytes, key_id: str) -> bytes:
    nonce = os.urandom(12)
    return nonce + AESGCM(kek).encrypt(nonce, dek, key_id.encode())


def open_with_kek(kek: bytes, wrapped: bytes, key_id: str) -> bytes:
    try:
        return AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], key_id.encode())
    except Exception as e:  # InvalidTag, short input
        raise KMSError(f"cannot unwrap the data key under KEK {key_id}") from e


@dataclass
class LocalKeyFile:
    """KEK in a local file (development).  Re-read at each status() so a
    replaced file is noticed; unwrap accepts only the current key."""

    path: Path

    def _key(self) -> tuple[bytes, str]:
        try:
            kek = read_key_file(self.path)
        except OSError as e:
            raise KMSError(f"cannot read the key file {self.path}: {e.strerror or e}") from e
        return kek, key_id_of(kek)

    def wrap(self, dek: bytes) -> tuple[bytes, str]:
        kek, kid = self._key()
        return seal_with_kek(kek, dek, kid), kid

    def unwrap(self, wrapped: bytes, key_id: str) -> bytes:
        kek, kid = self._key()
        if kid != key_id:
            raise KMSError(f"the key file {self.path} holds KEK {kid}, not {key_id}")
        return open_with_kek(kek, wrapped, key_id)

    def status(self) -> str:
        return self._key()[1]


@dataclass
class OAuth2ClientCredentials:
    """RFC 6749 §4.4: a token for the KMS from a token endpoint, cached."""

    token_url: str
    client_id: str
    client_secret: str
    scope: str = ""
    verify: Any = True
    timeout: float = 3.0
    _token: str = ""
    _expires: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    fetches: int = 0  # how many tokens were fetched (tests check the cache)

    def token(self) -> str:
        with self._lock:
            if self._token and time.monotonic() < self._expires:
                return self._token
            data = {"grant_type": "client_credentials"}
            if self.scope:
                data["scope"] = self.scope
            try:
                r = httpx.post(self.token_url, data=data, auth=(self.client_id, self.client_secret),
                               timeout=self.timeout, verify=self.verify)
            except httpx.HTTPError as e:
                raise KMSError(f"OAuth2 token endpoint {self.token_url} unreachable: {e}") from e
            if r.status_code != 200:
                raise KMSError(f"OAuth2 token endpoint {self.token_url} answered "
                               f"{r.status_code}: {r.text[:200]}")
            try:
                doc = r.json()
                tok = doc["access_token"]
                ttl = float(doc.get("expires_in") or 300)
            except (ValueError, KeyError, TypeError) as e:
                raise KMSError(f"OAuth2 token endpoint {self.token_url}: bad answer") from e
            self.fetches += 1
            # Refreshed a little early (a tenth, at most a minute) so no call
            # goes out with a token expiring in flight.
            self._token, self._expires = tok, time.monotonic() + ttl - min(60.0, ttl / 10)
            return tok


class RemoteKMS:
    """An external KMS over a unix socket or HTTPS, Fleet's JSON protocol."""

    def __init__(self, endpoint: str, *, timeout: float = 3.0, ca_file: str | None = None,
                 oauth2: OAuth2ClientCredentials | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.oauth2 = oauth2
        parts = urlsplit(endpoint)
        if parts.scheme == "unix":
            sock = parts.path or parts.netloc
            if not sock:
                raise ValueError(f"endpoint {endpoint!r}: no socket path")
            self._base = "http://kms"
            self._client = httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=timeout)
        elif parts.scheme == "https":
            if not parts.netloc:
                raise ValueError(f"endpoint {endpoint!r}: no host")
            self._base = endpoint.rstrip("/")
            verify: Any = True
            if ca_file:
                import ssl

                verify = ssl.create_default_context(cafile=ca_file)
            self._client = httpx.Client(timeout=timeout, verify=verify)
        else:
            raise ValueError(f"endpoint {endpoint!r}: must be unix:///path, https://host or file:///path")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {}
        if self.oauth2 is not None:
            headers["Authorization"] = f"Bearer {self.oauth2.token()}"
        try:
            r = self._client.request(method, self._base + path, json=body, headers=headers)
        except httpx.HTTPError as e:
            raise KMSError(f"KMS plugin at {self.endpoint} unreachable: {e or type(e).__name__}") from e
        if r.status_code // 100 != 2:
            raise KMSError(f"KMS plugin at {self.endpoint}: {method} {path} answered "
                           f"{r.status_code}: {r.text[:200]}")
        try:
            doc = r.json()
        except ValueError as e:
            raise KMSError(f"KMS plugin at {self.endpoint}: {path}: not JSON") from e
        if not isinstance(doc, dict):
            raise KMSError(f"KMS plugin at {self.endpoint}: {path}: not a JSON object")
        return doc

    def wrap(self, dek: bytes) -> tuple[bytes, str]:
        doc = self._call("POST", "/v1/wrap", {"plaintext": _b64(dek)})
        kid = doc.get("keyID")
        if not isinstance(kid, str) or not kid:
            raise KMSError(f"KMS plugin at {self.endpoint}: wrap answer lacks keyID")
        return _unb64(doc.get("ciphertext"), "ciphertext"), kid

    def unwrap(self, wrapped: bytes, key_id: str) -> bytes:
        doc = self._call("POST", "/v1/unwrap", {"ciphertext": _b64(wrapped), "keyID": key_id})
        return _unb64(doc.get("plaintext"), "plaintext")

    def status(self) -> str:
        doc = self._call("GET", "/v1/status")
        if doc.get("healthz") != "ok":
            raise KMSError(f"KMS plugin at {self.endpoint} is not healthy: {doc.get('healthz')!r}")
        kid = doc.get("keyID")
        if not isinstance(kid, str) or not kid:
            raise KMSError(f"KMS plugin at {self.endpoint}: status answer lacks keyID")
        return kid


def plugin_for(endpoint: str, *, timeout: float, ca_file: str | None = None,
               oauth2: dict[str, Any] | None = None) -> KMSPlugin:
    """The plugin an EncryptionConfiguration `kms` entry's endpoint names."""
    if endpoint.startswith("file://"):
        return LocalKeyFile(Path(urlsplit(endpoint).path))
    creds = None
    if oauth2:
        secret = oauth2.get("clientSecret") or ""
        if oauth2.get("clientSecretFile"):
            secret = Path(oauth2["clientSecretFile"]).read_text().strip()
        verify: Any = True
        if ca_file:
            import ssl

            verify = ssl.create_default_context(cafile=ca_file)
        creds = OAuth2ClientCredentials(token_url=oauth2["tokenURL"], client_id=oauth2["clientID"],
                                        client_secret=secret, scope=oauth2.get("scope") or "",
                                        verify=verify, timeout=timeout)
    return RemoteKMS(endpoint, timeout=timeout, ca_file=ca_file, oauth2=creds)
