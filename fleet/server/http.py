"""Framework-neutral request/response types used by the generic REST layer.

The Quart app adapts its request into `Req` and turns `Resp` back into a
response, so the resource logic is plain async Python that tests can drive
without sockets.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_to_bytes

from fleet.api.errors import APIError
from fleet.auth import UserInfo

JSON = "application/json"


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def split_raw_path(raw: bytes | str) -> list[str]:
    """The segments of a raw (still percent-encoded) path, each decoded.

    Every segment is kept, empty ones included: `/a//b/` is `["a", "", "b", ""]`
    and `/` is `[""]`.  Bytes that are not UTF-8 after decoding become U+FFFD
    (such a name can exist nowhere: it fails validation or is not found).
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    raw = raw.split(b"?", 1)[0]  # a raw_path never holds the query; a test-built path may
    parts = raw.split(b"/")
    if parts and parts[0] == b"":
        parts = parts[1:]  # the leading "/" of an origin-form target
    return [unquote_to_bytes(p).decode("utf-8", "replace") for p in parts]


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    user: UserInfo | None = None
    # The query string as sent (repeated keys intact), for relays that pass it on
    # verbatim (nodes/{name}/proxy); None when the request was built without one.
    raw_query: str | None = None
    # The request body as it arrives, instead of `body`, for relays that must not
    # hold it in memory (a multi-GB image archive through nodes/{name}/proxy).
    body_stream: AsyncIterator[bytes] | None = None
    # The path's segments, split on the RAW path and then each percent-decoded
    # (see fleet/server/paths.py): the ASGI layer passes them from
    # scope["raw_path"]; a Req built without them (tests, internal calls)
    # splits `path` the same way.  Routing reads these, never `path`.
    segments: list[str] = field(default_factory=list)
    # The TLS client certificate chain (DER, leaf first), unverified: the x509
    # authenticator decides (fleet/auth); () on a request without one.
    peer_certs: tuple[bytes, ...] = ()
    # The authenticated user when the request impersonates another (then `user` is the
    # impersonated one; fleet/auth/impersonation.py): the audit log records both.
    impersonator: UserInfo | None = None
    # The client's address ("host:port") and the request target as sent (path, still
    # percent-encoded, and query: Go's RequestURI), for the log and the audit trail.
    remote: str = ""
    request_uri: str = ""

    def __post_init__(self) -> None:
        if not self.segments:
            self.segments = split_raw_path(self.path)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "true", "yes")


@dataclass
class Resp:
    status: int
    body: bytes | AsyncIterator[bytes] = b""
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, obj: Any, headers: dict[str, str] | None = None) -> Resp:
        return cls(status, dumps(obj), JSON, headers or {})

    @classmethod
    def error(cls, err: APIError) -> Resp:
        headers = {}
        if err.retry_after is not None:
            headers["Retry-After"] = str(err.retry_after)
        return cls(err.code, dumps(err.status()), JSON, headers)
