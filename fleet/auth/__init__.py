"""Authentication and authorization stages of the request pipeline.

The API server builds a `Credentials` from each request (its headers and the
client certificate chain the TLS layer saw) and awaits
`authenticator.authenticate(creds) -> UserInfo | None`:

* `None`: this authenticator found no credentials of its kind (no bearer
  token, no client certificate): the next one is asked; when none answers the
  request is anonymous (or 401 if anonymous requests are off).
* `AuthenticationError`: credentials of its kind were presented and are not
  valid (expired, wrongly signed, revoked, wrong audience): 401.  The error's
  text goes to the server log and the audit trail, never to the client.

Then `authorizer.authorize(user, attributes) -> Decision` (synchronous:
authorizers decide from caches).  A `Decision` allows, denies, or (an
authorizer in a union that does not know the request) has no opinion.

Authenticators, authorizers and the names Kubernetes gives to well-known users
and groups live here; each mechanism has its own module (x509, service-account
tokens, OIDC, bootstrap tokens, RBAC, the Node authorizer, impersonation, audit).
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Well-known users and groups (k8s.io/apiserver/pkg/authentication/user).
SYSTEM_MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS_USER = "system:anonymous"
NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
SERVICE_ACCOUNT_USER_PREFIX = "system:serviceaccount:"
BOOTSTRAPPERS_GROUP = "system:bootstrappers"
KUBE_SCHEDULER_USER = "system:kube-scheduler"
KUBE_CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
# Fleet's node-local storage provisioner: the built-in agent's is the user itself; a
# joined node's is `<prefix><node>` in the group (fleet.agent.bootstrap.storage_identity).
STORAGE_PROVISIONER_USER = "system:fleet:storage-provisioner"
STORAGE_PROVISIONER_PREFIX = STORAGE_PROVISIONER_USER + ":"
STORAGE_PROVISIONERS_GROUP = "system:fleet:storage-provisioners"


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Attributes:
    """What a request wants to do, as an authorizer and admission plugins see it.

    A resource request names verb/group/version/resource(/subresource), namespace
    and name.  A non-resource request (`/healthz`, `/version`, `/api`, `/apis/...`
    discovery, `/openapi/...`, `/metrics`) has `resource_request=False`, its `path`
    and a lower-case HTTP verb (get, post, put, patch, delete, head), as
    kube-apiserver builds them.
    """

    verb: str  # get list watch create update patch delete deletecollection (+ escalate bind impersonate ...)
    group: str
    version: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    dry_run: bool = False
    path: str = ""
    resource_request: bool = True


def non_resource(verb: str, path: str) -> Attributes:
    """The attributes of a non-resource request (`GET /healthz` → verb `get`)."""
    return Attributes(verb, "", "", "", path=path, resource_request=False)


@dataclass(frozen=True)
class Decision:
    """An authorizer's answer.  `no_opinion`: neither allowed nor denied (a union of
    authorizers asks the next one); a final `allowed=False` is a 403 with `reason`."""

    allowed: bool
    reason: str = ""
    no_opinion: bool = False


@dataclass(frozen=True)
class Credentials:
    """What a request presents to prove who sends it.

    `headers` have lower-case names.  `peer_certs` is the client certificate chain
    (DER, leaf first) exactly as the TLS client sent it: the TLS layer requests a
    certificate but does not verify it, so that a bad one is a 401 from the x509
    authenticator (as kube-apiserver answers), not a failed handshake.
    """

    headers: Mapping[str, str]
    peer_certs: tuple[bytes, ...] = ()
    remote: str = ""


class AuthenticationError(Exception):
    """Credentials were presented and are not valid: the request gets 401.

    The message says why (expired, unknown signer, revoked ...) for the server log
    and the audit trail only; the client is told nothing beyond "Unauthorized".
    """


class Authenticator(Protocol):
    async def authenticate(self, creds: Credentials) -> UserInfo | None: ...


class Authorizer(Protocol):
    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision: ...


class TokenAuthenticator:
    """Static bearer tokens (name -> user), compared in constant time."""

    def __init__(self, tokens: dict[str, UserInfo]) -> None:
        self._tokens = dict(tokens)

    async def authenticate(self, creds: Credentials) -> UserInfo | None:
        return self.lookup(creds.headers)

    def lookup(self, headers: Mapping[str, str]) -> UserInfo | None:
        """The user of the request's bearer token, if it is one of these (else None:
        another authenticator may know the token)."""
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
    """Authorizer that allows every authenticated request (`--authorization-mode
    AlwaysAllow`: a development server, and the baseline of the security benchmark)."""

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        return Decision(True, "allow-all authorizer")


class UnionAuthenticator:
    """Asks each authenticator in turn; the first user found wins.

    An `AuthenticationError` from one is remembered and raised only if no later
    one authenticates the request (a bearer token one authenticator does not know
    may be another's), so bad credentials are a 401 rather than anonymous.
    """

    def __init__(self, *authenticators: Authenticator) -> None:
        self.authenticators = list(authenticators)

    async def authenticate(self, creds: Credentials) -> UserInfo | None:
        failure: AuthenticationError | None = None
        for a in self.authenticators:
            try:
                user = await a.authenticate(creds)
            except AuthenticationError as e:
                failure = failure or e
                continue
            if user is not None:
                return with_authenticated_group(user)
        if failure is not None:
            raise failure
        return None


def with_authenticated_group(user: UserInfo) -> UserInfo:
    """Every authenticated user is in `system:authenticated` (kube-apiserver adds it)."""
    if AUTHENTICATED in user.groups or user.name == ANONYMOUS_USER:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED), user.extra)


ANONYMOUS = UserInfo(ANONYMOUS_USER, groups=(UNAUTHENTICATED,))


class UnionAuthorizer:
    """The authorizers in order (`--authorization-mode Node,RBAC`): the first that
    allows or denies decides; when all have no opinion the request is denied — still
    marked `no_opinion` (kube's union answers DecisionNoOpinion), which an access
    review reports as not allowed yet not `denied`."""

    def __init__(self, *authorizers: Authorizer) -> None:
        self.authorizers = list(authorizers)

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        reasons: list[str] = []
        for a in self.authorizers:
            d = a.authorize(user, attrs)
            if not d.no_opinion:
                return d
            if d.reason:
                reasons.append(d.reason)
        return Decision(False, ", ".join(reasons), no_opinion=True)


class MastersBypass:
    """`system:masters` may do anything, before any other authorizer is asked (as
    kube-apiserver's privileged-group authorizer); others get no opinion."""

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        if SYSTEM_MASTERS in user.groups:
            return Decision(True)
        return Decision(False, no_opinion=True)


ADMIN = UserInfo("system:admin", groups=(SYSTEM_MASTERS, AUTHENTICATED))


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
