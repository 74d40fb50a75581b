"""Authentication and authorization stages of the request pipeline.

The API server calls `authenticate(headers) -> UserInfo | None` and then
`authorize(user, attributes) -> Decision`.  Issue 2 ships a bearer-token
authenticator (the admin token written into admin.kubeconfig, like k3s) and
an allow-all authorizer; RBAC, client certificates, ServiceAccount and OIDC
tokens plug in behind the same protocols later.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Attributes:
    """What a request wants to do, as an authorizer and admission plugins see it."""

    verb: str  # get list watch create update patch delete deletecollection
    group: str
    version: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    dry_run: bool = False


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class Authenticator(Protocol):
    def authenticate(self, headers: dict[str, str]) -> UserInfo | None: ...


class Authorizer(Protocol):
    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision: ...


class TokenAuthenticator:
    """Static bearer tokens (name -> user), compared in constant time."""

    def __init__(self, tokens: dict[str, UserInfo]) -> None:
        self._tokens = dict(tokens)

    def authenticate(self, headers: dict[str, str]) -> UserInfo | None:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        token = token.strip()
        for known, user in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return user
        return None


class AllowAll:
    """Authorizer that allows every authenticated request (until RBAC lands)."""

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        return Decision(True, "allow-all authorizer")


ADMIN = UserInfo("system:admin", groups=("system:masters", "system:authenticated"))


def load_or_create_admin_token(data_dir: Path) -> str:
    """The admin bearer token, generated at first start and kept in the data dir (0600)."""
    path = data_dir / "token"
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = "fleet-admin-" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
