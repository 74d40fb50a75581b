"""Bound ServiceAccount tokens for projected volumes: the kubelet's token manager.

A projected volume's `serviceAccountToken` source (the `kube-api-access-*` volume the
ServiceAccount admission plugin adds to every pod, or one a pod asks for itself) is
filled with a token from the TokenRequest API, as the kubelet's
pkg/kubelet/token/token_manager.go gets it:

    POST /api/v1/namespaces/{ns}/serviceaccounts/{serviceAccountName}/token
    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
     "spec": {"audiences": [audience] or [] (→ the API server's audiences),
              "expirationSeconds": N,
              "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": ..., "uid": ...}}}

The token is bound to the pod: it stops working when the pod is deleted.  Tokens are
cached per (namespace, account, audience, expirationSeconds, pod uid); the volume
refresh loop (fleet/agent/sandbox.py, every 10 s) asks again and gets the cached one
until `requires_refresh` says it is time — when 80% of its lifetime has passed or it
is older than 24 h, minus up to 10 s of jitter so a node's pods do not all ask at the
same second — and the volume's atomic writer (fleet/agent/volumes.py `write_atomic`)
swaps the new token in.  A failed refresh keeps serving the cached token while it is
still valid (logged); a first fetch that fails raises `TokenError("failed to fetch
token: ...")`, which the volume set-up turns into the kubelet's FailedMount event, and
the worker retries.  Expired entries are dropped from the cache as the kubelet's
cleanup does, and a torn-down pod's tokens with it (`forget`).

The cache lives in memory, as the kubelet's: a restarted agent sets its pods' volumes
up again, fetching fresh tokens, and the refresh loop carries on from there.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.api import meta

log = logging.getLogger(__name__)

MAX_TTL = 24 * 3600.0  # refresh a token older than this whatever its lifetime
MAX_JITTER = 10.0
REFRESH_FRACTION = 0.2  # refresh within the last 20% of the lifetime


class TokenError(Exception):
    """No token could be got (and none cached is still valid)."""


@dataclass(frozen=True)
class TokenKey:
    namespace: str
    service_account: str
    audience: str
    expiration_seconds: int
    pod_name: str
    pod_uid: str


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expires: float  # epoch seconds (status.expirationTimestamp)
    expiration_seconds: int  # the lifetime the server granted (spec.expirationSeconds)

    @property
    def issued(self) -> float:
        return self.expires - self.expiration_seconds


def requires_refresh(expires: float, expiration_seconds: int, now: float, jitter: float = 0.0) -> bool:
    """kubelet `requiresRefresh`: past 24 h since issue, or within the last 20% of the
    lifetime (both moved earlier by `jitter` seconds).  Issue time = expiry − lifetime."""
    issued = expires - expiration_seconds
    if now > issued + MAX_TTL - jitter:
        return True
    return now > expires - (expiration_seconds * 20 // 100) - jitter


def expired(expires: float, now: float) -> bool:
    return now >= expires


def token_request(pod: Mapping[str, Any], audience: str, expiration_seconds: int) -> dict[str, Any]:
    """The TokenRequest the kubelet sends for a projected token of `pod`."""
    md = pod.get("metadata") or {}
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [audience] if audience else [],
                     "expirationSeconds": int(expiration_seconds),
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                        "name": md.get("name", ""), "uid": md.get("uid", "")}}}


def parse_issued(answer: Mapping[str, Any], asked_seconds: int) -> IssuedToken:
    """The token and its expiry from a TokenRequest answer; ValueError if malformed."""
    status = answer.get("status") or {}
    token = status.get("token")
    stamp = status.get("expirationTimestamp")
    if not isinstance(token, str) or not token or not isinstance(stamp, str):
        raise ValueError("TokenRequest answer without status.token / status.expirationTimestamp")
    seconds = (answer.get("spec") or {}).get("expirationSeconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
        seconds = asked_seconds
    return IssuedToken(token, meta.parse_rfc3339(stamp).timestamp(), seconds)


class ServiceAccountTokens:
    """The node's token manager; an instance is a `fleet.agent.volumes.TokenSource`."""

    def __init__(self, client: Any, *, clock: Callable[[], float] = time.time,
                 jitter: Callable[[], float] = lambda: random.uniform(0, MAX_JITTER)) -> None:
        self.client = client
        self._clock = clock
        self._jitter = jitter
        self._cache: dict[TokenKey, IssuedToken] = {}

    def __len__(self) -> int:
        return len(self._cache)

    async def __call__(self, pod: Mapping[str, Any], audience: str, expiration_seconds: int) -> str:
        md = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        key = TokenKey(md.get("namespace") or "default",
                       spec.get("serviceAccountName") or "default", audience or "",
                       int(expiration_seconds), md.get("name", ""), md.get("uid", ""))
        now = self._clock()
        self._cleanup(now)
        cached = self._cache.get(key)
        if cached is not None and not requires_refresh(cached.expires, cached.expiration_seconds,
                                                       now, self._jitter()):
            return cached.token
        try:
            answer = await self.client.create(
                "v1", "serviceaccounts", token_request(pod, audience, expiration_seconds),
                key.namespace, subresource="token", name=key.service_account)
            issued = parse_issued(answer, key.expiration_seconds)
        except Exception as e:  # noqa: BLE001 - ApiException, transport errors, bad answers
            if cached is None:
                raise TokenError(f"failed to fetch token: {e}") from e
            if expired(cached.expires, self._clock()):
                raise TokenError(f"token {key.namespace}/{key.service_account} for pod "
                                 f"{key.pod_name} expired and refresh failed: {e}") from e
            log.error("couldn't update token for %s/%s (pod %s): %s", key.namespace,
                      key.service_account, key.pod_name, e)
            return cached.token
        self._cache[key] = issued
        return issued.token

    def _cleanup(self, now: float) -> None:
        for key in [k for k, t in self._cache.items() if expired(t.expires, now)]:
            del self._cache[key]

    def forget(self, pod_uid: str) -> None:
        """Drop the tokens of a pod that is gone."""
        for key in [k for k in self._cache if k.pod_uid == pod_uid]:
            del self._cache[key]
