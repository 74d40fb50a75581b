"""Who sends a request and whether they may: the access steps of the API
server's pipeline, as `RequestAccess`, the base of `APIServer` (app.py).

Authentication (a user, system:anonymous when allowed, or 401; why
credentials were refused goes to the log only), Impersonate-* headers
(fleet/auth/impersonation.py), RBAC authorization of resource and
non-resource requests with kube-apiserver's Forbidden messages, and the audit
hooks (fleet/auth/audit.py) for requests served outside `APIServer.handle`:
refused before the pipeline, or upgraded (connect.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fleet.api import errors
from fleet.auth import (
    ANONYMOUS,
    Attributes,
    AuthenticationError,
    Authenticator,
    Authorizer,
    Credentials,
    UserInfo,
    non_resource,
)
from fleet.auth.audit import (
    AUDIT_ID_RESPONSE_HEADER,
    Auditor,
    RequestAudit,
    auth_methods,
    record_authentication_failure,
    record_decision,
    record_impersonation,
)
from fleet.auth.audit import CURRENT as AUDIT_CURRENT
from fleet.auth.impersonation import (
    ImpersonationHeaderError,
    impersonate,
    without_impersonation_headers,
)
from fleet.server.asgi import remote_address, request_uri
from fleet.server.http import Req, Resp
from fleet.server.requestinfo import request_attributes
from fleet.server.routes import Route

log = logging.getLogger(__name__)


class RequestAccess:
    """What the access steps read; `APIServer.__init__` sets it."""

    audit: Auditor | None
    anonymous: bool
    authenticator: Authenticator
    authorizer: Authorizer

    async def audit_refused(self, req: Req, resp: Resp) -> None:
        """Audit a request answered before the pipeline (body too large, or too slow to
        arrive) as whoever its credentials say, like any other."""
        assert self.audit is not None
        ra = self.audit.begin(request_uri=req.request_uri or req.path, headers=req.headers,
                              remote=req.remote)
        token = AUDIT_CURRENT.set(ra)
        try:
            ra.authenticated(await self.authenticate(req.headers, req.peer_certs, req.remote),
                             request_attributes(req))
        except errors.APIError:
            ra.refused(request_attributes(req), auth_methods(req.headers, req.peer_certs, req.query))
        finally:
            AUDIT_CURRENT.reset(token)
        resp.headers[AUDIT_ID_RESPONSE_HEADER] = ra.audit_id
        ra.complete(resp.status, resp.body if isinstance(resp.body, bytes) else b"", resp.content_type)

    def audit_begin(self, scope: dict[str, Any], headers: dict[str, str]) -> RequestAudit | None:
        """The audit of a request served outside `handle` (WebSocket and SPDY upgrades)."""
        if self.audit is None:
            return None
        return self.audit.begin(request_uri=request_uri(scope), headers=headers, remote=remote_address(scope))

    async def authenticate(self, headers: Mapping[str, str], peer_certs: tuple[bytes, ...] = (),
                           remote: str = "") -> UserInfo:
        """Who sends the request: a user, system:anonymous (if allowed), or 401.

        Why credentials were refused goes to the log, never to the client."""
        try:
            user = await self.authenticator.authenticate(Credentials(headers, peer_certs, remote))
        except AuthenticationError as e:
            log.info("authentication failed%s: %s", f" for {remote}" if remote else "", e)
            record_authentication_failure(str(e))
            raise errors.Unauthorized("Unauthorized") from None
        if user is not None:
            return user
        if self.anonymous:
            return ANONYMOUS
        raise errors.Unauthorized("Unauthorized")

    def impersonate(self, user: UserInfo, headers: Mapping[str, str]) -> UserInfo | None:
        """The user a request acts as when it carries Impersonate-* headers (None
        otherwise), each impersonated attribute authorized for `user`
        (fleet/auth/impersonation.py): 403 when one is not allowed."""
        return impersonate(user, headers, lambda attrs: self.authorizer.authorize(user, attrs))

    def authorize_path(self, req: Req, path: str) -> None:
        """A non-resource request (health, version, discovery, OpenAPI) is authorized
        on its path, as kube-apiserver does (RBAC's nonResourceURLs)."""
        assert req.user is not None
        verb = req.method.lower()
        decision = self.authorizer.authorize(req.user, non_resource(verb, path))
        record_decision(decision)
        if not decision.allowed:
            msg = f'forbidden: User "{req.user.name}" cannot {verb} path "{path}"'
            raise errors.Forbidden(msg + (f": {decision.reason}" if decision.reason else ""))

    def authorize(self, user: UserInfo | None, verb: str, route: Route, info: Any) -> None:
        assert user is not None
        decision = self.authorizer.authorize(user, Attributes(
            verb, route.group, route.version, route.plural, route.subresource,
            route.namespace or "", route.name or ""))
        record_decision(decision)
        if not decision.allowed:
            raise errors.Forbidden(self.forbidden_message(user, verb, info.plural, info.group,
                                                          route.namespace, decision.reason,
                                                          name=route.name or "",
                                                          subresource=route.subresource),
                                   name=route.name, group=info.group, kind=info.plural)

    def apply_impersonation(self, req: Req) -> None:
        """Impersonate-* headers: `req.user` becomes the impersonated user (checked with
        verb `impersonate`), the authenticated one is kept as `req.impersonator` (the
        audit event's user; impersonatedUser is the new one)."""
        assert req.user is not None
        acting = self.impersonate(req.user, req.headers)
        if acting is not None:
            req.impersonator, req.user = req.user, acting
            req.headers = without_impersonation_headers(req.headers)
            record_impersonation(acting)

    def _acting_user(self, user: UserInfo, headers: Mapping[str, str]) -> UserInfo:
        """`impersonate` for the upgrade paths (no Req): malformed headers are a 400
        BadRequest Status, as on every other path."""
        try:
            acting = self.impersonate(user, headers)
        except ImpersonationHeaderError as e:
            raise errors.BadRequest(str(e)) from None
        if acting is None:
            return user
        record_impersonation(acting)
        return acting

    @staticmethod
    def forbidden_message(user: UserInfo, verb: str, plural: str, group: str, ns: str | None,
                          reason: str, *, name: str = "", subresource: str = "") -> str:
        """responsewriters.ForbiddenStatusError's message: the group-qualified resource and
        the object's name as apierrors.NewForbidden words them (`pods "p" is forbidden:
        User "u" cannot create resource "pods/exec" ...`)."""
        resource = plural + (f"/{subresource}" if subresource else "")
        scope = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        qualified = f"{plural}.{group}" if group else plural  # the object's resource, no subresource
        head = f'{qualified} "{name}"' if name else qualified
        msg = (f'{head} is forbidden: User "{user.name}" cannot {verb} resource "{resource}" '
               f'in API group "{group}"{scope}')
        return msg + (f": {reason}" if reason else "")
