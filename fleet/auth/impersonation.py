"""Impersonation: acting as another user (`kubectl --as bob --as-group devs`).

Right after authentication the API server looks at the request's impersonation
headers (k8s.io/apiserver's WithImpersonation filter):

    Impersonate-User: bob                      (or system:serviceaccount:<ns>:<name>)
    Impersonate-Group: devs                    (repeatable)
    Impersonate-Uid: 1234
    Impersonate-Extra-<key>: value             (repeatable; <key> percent-encoded)

Each thing asked for is authorized for the *authenticated* user with verb
`impersonate`, in Kubernetes' resources: `users`, `groups` and `serviceaccounts`
(namespace + name) in the core group, `uids` and `userextras/<key>` in
`authentication.k8s.io`.  The first refusal is a 403 in kube-apiserver's words
(`users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API
group "" at the cluster scope`).  Groups, extras or a uid without a user are a
malformed request: kube-apiserver answers 500 with a plain-text body, and so does
Fleet (`ImpersonationHeaderError`).

When everything is allowed the request continues as the impersonated user: its
groups are the ones asked for (a service account without groups gets its fixed
`system:serviceaccounts[:<ns>]`), plus `system:authenticated` — or
`system:unauthenticated` for `system:anonymous`.  The server keeps the original
user beside it (`Req.impersonator`) for the audit log, and drops the headers so
nothing downstream (a relay to an agent) sees them.

Header values: the server's header dict joins repeated headers with ", " (as HTTP
allows folding them); Impersonate-Group and Impersonate-Extra-* are split on that
joiner back into one value per header line.  A single header value that itself
contains ", " would therefore count as several (kube-apiserver keeps it whole).
Everything here is pure: `impersonation_requests` parses headers, `impersonate`
decides with an `authorize(attributes) -> Decision` callback.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from fleet.api import errors, validation
from fleet.auth import (
    ANONYMOUS_USER,
    AUTHENTICATED,
    SERVICE_ACCOUNT_USER_PREFIX,
    SERVICE_ACCOUNTS_GROUP,
    UNAUTHENTICATED,
    Attributes,
    Decision,
    UserInfo,
)

USER_HEADER = "impersonate-user"
GROUP_HEADER = "impersonate-group"
UID_HEADER = "impersonate-uid"
EXTRA_HEADER_PREFIX = "impersonate-extra-"

AUTHENTICATION_GROUP = "authentication.k8s.io"
_JOINER = ", "  # how fleet/server/asgi.py `scope_headers` joins a repeated header
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class ImpersonationHeaderError(Exception):
    """The impersonation headers are malformed (groups, extras or a uid without a user).

    The message is kube-apiserver's; the answer is a 400 BadRequest Status where
    kube-apiserver sends a plain-text 500 (`responsewriters.InternalError`): a client's
    malformed headers are not a server error."""


@dataclass(frozen=True)
class ImpersonationRequest:
    """One thing asked for (kube's ObjectReference per request): kind is ServiceAccount,
    User, Group, UserExtra or UID; `extra_key` is a UserExtra's key (its FieldPath)."""

    kind: str
    name: str
    namespace: str = ""
    extra_key: str = ""

    @property
    def api_version(self) -> str:
        return f"{AUTHENTICATION_GROUP}/v1" if self.kind in ("UserExtra", "UID") else ""

    def attributes(self) -> Attributes:
        """The `impersonate` request the authenticated user must be allowed."""
        resource, subresource, group, version = {
            # kube takes the version from the reference's apiVersion: none for these three.
            "ServiceAccount": ("serviceaccounts", "", "", ""),
            "User": ("users", "", "", ""),
            "Group": ("groups", "", "", ""),
            "UserExtra": ("userextras", self.extra_key, AUTHENTICATION_GROUP, "v1"),
            "UID": ("uids", "", AUTHENTICATION_GROUP, "v1"),
        }[self.kind]
        return Attributes("impersonate", group, version, resource, subresource,
                          namespace=self.namespace, name=self.name)

    def go_string(self) -> str:
        """Go's `%v` of the v1.ObjectReference kube builds (its error messages show it):
        Kind Namespace Name UID APIVersion ResourceVersion FieldPath, space-separated."""
        return "{" + " ".join((self.kind, self.namespace, self.name, "", self.api_version, "",
                               self.extra_key)) + "}"


def split_service_account(username: str) -> tuple[str, str] | None:
    """serviceaccount.SplitUsername: (namespace, name) of `system:serviceaccount:<ns>:<name>`
    when both parts are valid names, else None (then it is an ordinary user name)."""
    if not username.startswith(SERVICE_ACCOUNT_USER_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_USER_PREFIX):].split(":")
    if len(parts) != 2:
        return None
    namespace, name = parts
    if validation.is_dns1123_label(namespace) or validation.is_dns1123_subdomain(name):
        return None
    return namespace, name


def _values(raw: str) -> list[str]:
    return raw.split(_JOINER)


def unescape_extra_key(encoded: str) -> str:
    """url.PathUnescape of the key; a malformed escape keeps the key as sent."""
    if _BAD_ESCAPE.search(encoded):
        return encoded
    return unquote(encoded, errors="replace")


def impersonation_requests(headers: Mapping[str, str]) -> list[ImpersonationRequest]:
    """What the headers ask to impersonate, in kube's order (user, groups, extras, uid);
    [] when they ask nothing.  `headers` have lower-case names."""
    out: list[ImpersonationRequest] = []
    user = headers.get(USER_HEADER, "")
    if user:
        sa = split_service_account(user)
        if sa is not None:
            out.append(ImpersonationRequest("ServiceAccount", sa[1], namespace=sa[0]))
        else:
            out.append(ImpersonationRequest("User", user))
    has_groups = GROUP_HEADER in headers
    if has_groups:
        out.extend(ImpersonationRequest("Group", g) for g in _values(headers[GROUP_HEADER]))
    has_extra = False
    for name, raw in headers.items():
        if not name.lower().startswith(EXTRA_HEADER_PREFIX):
            continue
        has_extra = True
        key = unescape_extra_key(name.lower()[len(EXTRA_HEADER_PREFIX):])
        out.extend(ImpersonationRequest("UserExtra", value, extra_key=key) for value in _values(raw))
    uid = headers.get(UID_HEADER, "")
    if uid:
        out.append(ImpersonationRequest("UID", uid))
    if (has_groups or has_extra or uid) and not user:
        raise ImpersonationHeaderError(
            "requested [" + " ".join(r.go_string() for r in out) + "] without impersonating a user")
    return out


def impersonated_user(requests: list[ImpersonationRequest]) -> UserInfo:
    """The user the (allowed) requests describe, with kube's group rules."""
    username, uid = "", ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    groups_specified = any(r.kind == "Group" for r in requests)
    for r in requests:
        if r.kind == "ServiceAccount":
            username = f"{SERVICE_ACCOUNT_USER_PREFIX}{r.namespace}:{r.name}"
            if not groups_specified:
                groups = [SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{r.namespace}"]
        elif r.kind == "User":
            username = r.name
        elif r.kind == "Group":
            groups.append(r.name)
        elif r.kind == "UserExtra":
            extra.setdefault(r.extra_key, []).append(r.name)
        elif r.kind == "UID":
            uid = r.name
    if username != ANONYMOUS_USER:
        if AUTHENTICATED not in groups and UNAUTHENTICATED not in groups:
            groups.append(AUTHENTICATED)
    elif UNAUTHENTICATED not in groups:
        groups.append(UNAUTHENTICATED)
    return UserInfo(username, uid, tuple(groups), extra)


def forbidden(requester: UserInfo, attrs: Attributes, reason: str) -> errors.Forbidden:
    """responsewriters.ForbiddenStatusError for an impersonate check."""
    resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
    where = f' in the namespace "{attrs.namespace}"' if attrs.namespace else " at the cluster scope"
    msg = (f'User "{requester.name}" cannot {attrs.verb} resource "{resource}" in API group '
           f'"{attrs.group}"{where}')
    if reason:
        msg += f": {reason}"
    # NewForbidden's GroupResource is the resource alone (no subresource).
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    head = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    return errors.Forbidden(f"{head} is forbidden: {msg}", name=attrs.name, group=attrs.group,
                            kind=attrs.resource)


def impersonate(requester: UserInfo, headers: Mapping[str, str],
                authorize: Callable[[Attributes], Decision]) -> UserInfo | None:
    """The user the request acts as, or None when it impersonates no one.

    Raises `ImpersonationHeaderError` for malformed headers and `errors.Forbidden` for
    the first thing `requester` may not impersonate."""
    requests = impersonation_requests(headers)
    if not requests:
        return None
    for r in requests:
        attrs = r.attributes()
        decision = authorize(attrs)
        if not decision.allowed:
            raise forbidden(requester, attrs, decision.reason)
    return impersonated_user(requests)


def without_impersonation_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers minus the impersonation ones (kube deletes them once applied)."""
    return {k: val for k, val in headers.items()
            if k not in (USER_HEADER, GROUP_HEADER, UID_HEADER) and not k.startswith(EXTRA_HEADER_PREFIX)}


__all__ = [
    "EXTRA_HEADER_PREFIX", "GROUP_HEADER", "UID_HEADER", "USER_HEADER", "ImpersonationHeaderError",
    "ImpersonationRequest", "forbidden", "impersonate", "impersonated_user", "impersonation_requests",
    "split_service_account", "unescape_extra_key", "without_impersonation_headers",
]
