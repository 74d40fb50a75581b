"""Encryption at rest: kube-apiserver's EncryptionConfiguration, applied at the
store's one encode/decode seam (`ValueCodec`, fleet/store/codec.py).

What it owns:

* Parsing and validating the config file (`apiserver.config.k8s.io/v1`,
  kind EncryptionConfiguration): `resources: [{resources: [...], providers: [...]}]`.
  Resource names are `secrets` (core group), `deployments.apps`, `*.apps`, `*.`
  (every core resource), `*.*`; the first entry naming a resource wins.
  Providers, in order: the first encrypts every write, all are tried on read.
  Supported: `identity: {}`, `aesgcm: {keys: [{name, secret}]}` (base64 16/24/32
  bytes) and `kms: {apiVersion: v2, name, endpoint, timeout}`.  (`aescbc`,
  `secretbox` and kms v1 are refused by name, so a config meant for
  kube-apiserver never silently stores plaintext here.)
* The stored format, Kubernetes' prefixes then our text payload (the store's
  column is TEXT): `k8s:enc:aesgcm:v1:<key name>:` + base64(nonce ‖ ciphertext), and
  `k8s:enc:kms:v2:<provider name>:` + a JSON envelope {k: KEK id, w: wrapped DEK,
  s: salt, n: nonce, c: ciphertext}.  Values with no `k8s:enc:` prefix are
  plaintext JSON, readable only when `identity` is among the providers (as in
  Kubernetes, where that is how encryption is turned on for an existing cluster).
* The envelope (kms v2): a DEK seed of 32 random bytes is wrapped once by the
  KMS plugin (fleet/store/kms.py) and reused; every write derives its own
  AES-256-GCM key with HKDF-SHA256(seed, salt = 32 fresh random bytes), as
  Kubernetes' KMSv2KDF does, so no two writes share a key and the KMS is called
  only when the seed changes (at start, when the KMS reports a new KEK id, or
  after 2^24 writes).  Reads unwrap each distinct wrapped seed once (cache).
* Additional authenticated data is the object's storage key for both aesgcm
  and kms, so a ciphertext copied under another key does not decrypt.

Fail closed: `load_codec` asks every kms provider for its status before the
store opens; an unreachable KMS stops the server with the provider named.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fleet.store.base import StoreError
from fleet.store.kms import KMSError, KMSPlugin, plugin_for

API_VERSION = "apiserver.config.k8s.io/v1"
KIND = "EncryptionConfiguration"
PREFIX = "k8s:enc:"
# Writes one DEK seed serves before a fresh one is wrapped (Kubernetes rotates
# its seed on a similar count; the per-write HKDF already keeps keys distinct).
SEED_WRITES = 1 << 24
# How often (seconds) a writing codec asks its KMS whether the KEK changed.
STATUS_INTERVAL = 60.0


class EncryptionConfigError(ValueError):
    """The encryption config is invalid, or a KMS it names is unreachable."""


class DecryptError(StoreError):
    """A stored value no configured provider can read."""


# --------------------------------------------------------------------------
# Providers


class Provider:
    """One entry of a providers list."""

    name: str

    def prefix(self) -> str:
        raise NotImplementedError

    def seal(self, key: str, text: str) -> str:
        raise NotImplementedError

    def open(self, key: str, stored: str) -> str | None:
        """The plaintext, or None when `stored` is not this provider's."""
        raise NotImplementedError


class Identity(Provider):
    name = "identity"

    def prefix(self) -> str:
        return ""

    def seal(self, key: str, text: str) -> str:
        return text

    def open(self, key: str, stored: str) -> str | None:
        return None if stored.startswith(PREFIX) else stored


@dataclass
class AESGCMKey(Provider):
    name: str
    secret: bytes

    def prefix(self) -> str:
        return f"{PREFIX}aesgcm:v1:{self.name}:"

    def seal(self, key: str, text: str) -> str:
        nonce = os.urandom(12)
        ct = AESGCM(self.secret).encrypt(nonce, text.encode(), key.encode())
        return self.prefix() + base64.b64encode(nonce + ct).decode()

    def open(self, key: str, stored: str) -> str | None:
        p = self.prefix()
        if not stored.startswith(p):
            return None
        try:
            raw = base64.b64decode(stored[len(p):], validate=True)
            return AESGCM(self.secret).decrypt(raw[:12], raw[12:], key.encode()).decode()
        except Exception as e:  # InvalidTag, bad base64
            raise DecryptError(f"{key}: cannot decrypt with aesgcm key {self.name!r}") from e


def _hkdf(seed: bytes, salt: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"fleet kms v2").derive(seed)


@dataclass
class KMSv2(Provider):
    name: str
    plugin: KMSPlugin
    endpoint: str = ""
    # Written under (seed, wrapped seed, KEK id, writes so far).
    _seed: tuple[bytes, bytes, str] | None = None
    _writes: int = 0
    _checked: float = 0.0
    _cache: dict[tuple[str, bytes], bytes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prefix(self) -> str:
        return f"{PREFIX}kms:v2:{self.name}:"

    def check(self) -> str:
        try:
            return self.plugin.status()
        except KMSError as e:
            raise EncryptionConfigError(f'kms provider "{self.name}": {e}') from e

    def _current_seed(self) -> tuple[bytes, bytes, str]:
        with self._lock:
            now = time.monotonic()
            stale = self._seed is None or self._writes >= SEED_WRITES
            if not stale and now - self._checked > STATUS_INTERVAL:
                self._checked = now
                try:
                    stale = self.plugin.status() != self._seed[2]  # type: ignore[index]
                except KMSError:
                    stale = False  # keep writing under the seed we hold; reads still work
            if stale:
                seed = os.urandom(32)
                try:
                    wrapped, kid = self.plugin.wrap(seed)
                except KMSError as e:
                    raise StoreError(f'kms provider "{self.name}": {e}') from e
                self._seed, self._writes, self._checked = (seed, wrapped, kid), 0, now
                self._cache[(kid, wrapped)] = seed
            self._writes += 1
            assert self._seed is not None
            return self._seed

    def seal(self, key: str, text: str) -> str:
        seed, wrapped, kid = self._current_seed()
        salt, nonce = os.urandom(32), os.urandom(12)
        ct = AESGCM(_hkdf(seed, salt)).encrypt(nonce, text.encode(), key.encode())
        env = {"k": kid, "w": _b64(wrapped), "s": _b64(salt), "n": _b64(nonce), "c": _b64(ct)}
        return self.prefix() + json.dumps(env, separators=(",", ":"))

    def open(self, key: str, stored: str) -> str | None:
        p = self.prefix()
        if not stored.startswith(p):
            return None
        try:
            env = json.loads(stored[len(p):])
            kid, wrapped = env["k"], _unb64(env["w"])
            salt, nonce, ct = _unb64(env["s"]), _unb64(env["n"]), _unb64(env["c"])
        except (ValueError, KeyError, TypeError) as e:
            raise DecryptError(f"{key}: malformed kms v2 envelope ({self.name})") from e
        seed = self._cache.get((kid, wrapped))
        if seed is None:
            try:
                seed = self.plugin.unwrap(wrapped, kid)
            except KMSError as e:
                raise DecryptError(f'{key}: kms provider "{self.name}": {e}') from e
            with self._lock:
                self._cache[(kid, wrapped)] = seed
        try:
            return AESGCM(_hkdf(seed, salt)).decrypt(nonce, ct, key.encode()).decode()
        except Exception as e:
            raise DecryptError(f'{key}: cannot decrypt with kms provider "{self.name}"') from e


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: Any) -> bytes:
    if not isinstance(s, str):
        raise ValueError("not a string")
    return base64.b64decode(s, validate=True)


# --------------------------------------------------------------------------
# The config


@dataclass
class ResourceRule:
    resources: list[str]
    providers: list[Provider]

    def matches(self, group: str, resource: str) -> bool:
        for r in self.resources:
            name, _, g = r.partition(".")
            if name == "*" and g == "*":
                return True
            if (name == "*" or name == resource) and g == group:
                return True
        return False


def _parse_resource(r: Any, where: str) -> str:
    if not isinstance(r, str) or not r:
        raise EncryptionConfigError(f"{where}: a resource must be a non-empty string")
    name, dot, group = r.partition(".")
    if r != r.lower():
        raise EncryptionConfigError(f"{where}: {r!r}: resource names are lowercase")
    if name == "*" and not dot:
        raise EncryptionConfigError(f"{where}: {r!r}: use '*.' for every core resource or '*.*' for all")
    if group == "*" and name != "*":
        raise EncryptionConfigError(f"{where}: {r!r}: a group wildcard needs a resource wildcard ('*.*')")
    return r


def _parse_provider(p: Any, where: str, kms_names: set[str],
                    make_plugin: Callable[..., KMSPlugin]) -> list[Provider]:
    if not isinstance(p, dict) or len(p) != 1:
        raise EncryptionConfigError(f"{where}: each provider names exactly one type")
    ((kind, body),) = p.items()
    if kind == "identity":
        return [Identity()]
    if kind in ("aescbc", "secretbox"):
        raise EncryptionConfigError(f"{where}: provider {kind!r} is not supported by Fleet "
                                    "(use aesgcm or kms)")
    if not isinstance(body, dict):
        raise EncryptionConfigError(f"{where}: {kind}: must be a mapping")
    if kind == "aesgcm":
        keys = body.get("keys")
        if not isinstance(keys, list) or not keys:
            raise EncryptionConfigError(f"{where}: aesgcm: keys: at least one key is required")
        out: list[Provider] = []
        seen = set()
        for i, k in enumerate(keys):
            kw = f"{where}.aesgcm.keys[{i}]"
            if not isinstance(k, dict):
                raise EncryptionConfigError(f"{kw}: must be a mapping with name and secret")
            name, secret = k.get("name"), k.get("secret")
            if not isinstance(name, str) or not name or ":" in name:
                raise EncryptionConfigError(f"{kw}.name: required, without ':'")
            if name in seen:
                raise EncryptionConfigError(f"{kw}.name: {name!r} is used twice")
            seen.add(name)
            try:
                raw = base64.b64decode(secret or "", validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise EncryptionConfigError(f"{kw}.secret: not valid base64") from None
            if len(raw) not in (16, 24, 32):
                raise EncryptionConfigError(
                    f"{kw}.secret: key of length {len(raw)} is invalid, expected 16, 24 or 32 bytes")
            out.append(AESGCMKey(name, raw))
        return out
    if kind == "kms":
        if body.get("apiVersion", "v1") != "v2":
            raise EncryptionConfigError(f"{where}: kms: only apiVersion v2 is supported")
        name, endpoint = body.get("name"), body.get("endpoint")
        if not isinstance(name, str) or not name or ":" in name:
            raise EncryptionConfigError(f"{where}: kms.name: required, without ':'")
        if name in kms_names:
            raise EncryptionConfigError(f"{where}: kms.name: {name!r} is used twice "
                                        "(kms provider names must be unique)")
        kms_names.add(name)
        if not isinstance(endpoint, str) or not endpoint:
            raise EncryptionConfigError(f"{where}: kms.endpoint: required")
        timeout = _duration(body.get("timeout", "3s"), f"{where}: kms.timeout")
        oauth2 = body.get("oauth2")
        if oauth2 is not None and (not isinstance(oauth2, dict) or not oauth2.get("tokenURL")
                                   or not oauth2.get("clientID")):
            raise EncryptionConfigError(f"{where}: kms.oauth2: tokenURL and clientID are required")
        try:
            plugin = make_plugin(endpoint, timeout=timeout, ca_file=body.get("caFile"), oauth2=oauth2)
        except (ValueError, OSError, KeyError) as e:
            raise EncryptionConfigError(f"{where}: kms {name!r}: {e}") from e
        return [KMSv2(name, plugin, endpoint)]
    raise EncryptionConfigError(f"{where}: unknown provider type {kind!r}")


def _duration(v: Any, where: str) -> float:
    if isinstance(v, (int, float)) and v > 0:
        return float(v)
    if isinstance(v, str):
        units = {"ms": 0.001, "s": 1.0, "m": 60.0}
        for suffix in ("ms", "s", "m"):
            if v.endswith(suffix):
                try:
                    n = float(v[: -len(suffix)])
                except ValueError:
                    break
                if n > 0:
                    return n * units[suffix]
    raise EncryptionConfigError(f"{where}: {v!r} is not a positive duration (e.g. 3s)")


def parse_config(doc: Any, *, make_plugin: Callable[..., KMSPlugin] = plugin_for) -> list[ResourceRule]:
    """Validate an EncryptionConfiguration document (pure but for building the
    plugins' clients; nothing is contacted)."""
    if not isinstance(doc, dict):
        raise EncryptionConfigError("not a mapping")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise EncryptionConfigError(f"expected kind {KIND}, apiVersion {API_VERSION}; got "
                                    f"{doc.get('kind')!r}, {doc.get('apiVersion')!r}")
    entries = doc.get("resources")
    if not isinstance(entries, list) or not entries:
        raise EncryptionConfigError("resources: at least one entry is required")
    rules: list[ResourceRule] = []
    kms_names: set[str] = set()
    seen: set[str] = set()
    for i, e in enumerate(entries):
        where = f"resources[{i}]"
        if not isinstance(e, dict):
            raise EncryptionConfigError(f"{where}: must be a mapping")
        res = e.get("resources")
        if not isinstance(res, list) or not res:
            raise EncryptionConfigError(f"{where}.resources: at least one resource is required")
        names = [_parse_resource(r, f"{where}.resources") for r in res]
        for n in names:
            if n in seen:
                raise EncryptionConfigError(f"{where}.resources: {n!r} is listed twice")
            seen.add(n)
        provs = e.get("providers")
        if not isinstance(provs, list) or not provs:
            raise EncryptionConfigError(f"{where}.providers: at least one provider is required")
        providers: list[Provider] = []
        for j, p in enumerate(provs):
            providers += _parse_provider(p, f"{where}.providers[{j}]", kms_names, make_plugin)
        rules.append(ResourceRule(names, providers))
    return rules


def group_resource(storage_key: str) -> tuple[str, str] | None:
    """(group, resource) of a store key `/{group or core}/{plural}/...`."""
    parts = storage_key.split("/")
    if len(parts) < 4 or parts[0] != "":
        return None
    group = "" if parts[1] == "core" else parts[1]
    return group, parts[2]


class EncryptionCodec:
    """The store's ValueCodec under an EncryptionConfiguration."""

    def __init__(self, rules: list[ResourceRule]) -> None:
        self.rules = rules
        self._memo: dict[tuple[str, str], list[Provider] | None] = {}

    def providers_for(self, storage_key: str) -> list[Provider] | None:
        gr = group_resource(storage_key)
        if gr is None:
            return None
        if gr not in self._memo:
            self._memo[gr] = next((r.providers for r in self.rules if r.matches(*gr)), None)
        return self._memo[gr]

    def seal(self, key: str, text: str) -> str:
        provs = self.providers_for(key)
        return text if provs is None else provs[0].seal(key, text)

    def open(self, key: str, stored: str) -> str:
        provs = self.providers_for(key)
        if provs is None:
            if stored.startswith(PREFIX):
                raise DecryptError(f"{key}: stored encrypted, but no encryption config entry "
                                   "covers this resource")
            return stored
        for p in provs:
            text = p.open(key, stored)
            if text is not None:
                return text
        head = stored[:40].rsplit(":", 1)[0] if stored.startswith(PREFIX) else "plaintext"
        raise DecryptError(f"{key}: no provider can read this value ({head}); "
                           "was a key removed from the encryption config?")

    def kms_providers(self) -> list[KMSv2]:
        seen: dict[str, KMSv2] = {}
        for r in self.rules:
            for p in r.providers:
                if isinstance(p, KMSv2):
                    seen.setdefault(p.name, p)
        return list(seen.values())

    def check(self) -> None:
        """Fail closed: every kms provider must answer its status now."""
        for p in self.kms_providers():
            p.check()


def load_config(path: str | os.PathLike[str], **kw: Any) -> EncryptionCodec:
    """Parse and validate the file; nothing is contacted yet."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise EncryptionConfigError(f"{path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise EncryptionConfigError(f"{path}: not YAML: {e}") from e
    try:
        return EncryptionCodec(parse_config(doc, **kw))
    except EncryptionConfigError as e:
        raise EncryptionConfigError(f"{path}: {e}") from e


def load_codec(path: str | os.PathLike[str]) -> EncryptionCodec:
    """Parse, validate, and check every KMS is reachable (blocking: run it in a thread)."""
    codec = load_config(path)
    codec.check()
    return codec
