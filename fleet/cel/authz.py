"""The Kubernetes CEL authorizer library: `authorizer` in policies and matchConditions.

k8s.io/apiserver/pkg/cel/library/authz.go: an expression asks the server's
authorizer whether the request's user (or a service account) may do something:

    authorizer.group('apps').resource('deployments').namespace('ns').name('web').check('delete').allowed()
    authorizer.path('/healthz').check('get').allowed()
    authorizer.serviceAccount('ns', 'sa').group('').resource('pods').check('list').reason()
    authorizer.requestResource.subresource('scale').check('update').allowed()

`Authz(check, user)` is the `authorizer` value; `check(user, attrs) -> Decision` is
Fleet's `Authorizer.authorize` (synchronous, as CEL evaluation is).  Decisions
answer `allowed()`, `reason()`, `errored()`, `error()`.  Checks are asked with
API version `*`, as kube-apiserver does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from fleet.auth import Attributes, Decision, UserInfo

CheckFn = Callable[[UserInfo, Attributes], Decision]


class Authz(celtypes.MapType):
    """`authorizer`: a map so that `authorizer.requestResource` is a field access."""

    def __init__(self, check: CheckFn | None, user: UserInfo,
                 request_resource: ResourceCheck | None = None) -> None:
        super().__init__()
        self.check_fn, self.user = check, user
        if request_resource is not None:
            super().__setitem__(celtypes.StringType("requestResource"),
                                replace(request_resource, authz=self))


@dataclass(frozen=True, eq=False)
class PathCheck:
    authz: Authz
    path: str


@dataclass(frozen=True, eq=False)
class ResourceCheck:
    authz: Authz | None
    group: str
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True)
class AuthzDecision:
    allowed: bool
    reason: str
    error: str = ""


def request_resource(group: str, resource: str, subresource: str, namespace: str, name: str) -> ResourceCheck:
    """The request's own resource, for `authorizer.requestResource` (bound by `Authz`)."""
    return ResourceCheck(None, group, resource, subresource, namespace, name)


def _ask(authz: Authz | None, attrs: Attributes) -> AuthzDecision:
    if authz is None or authz.check_fn is None:
        return AuthzDecision(False, "", "no authorizer is configured")
    try:
        d = authz.check_fn(authz.user, attrs)
    except Exception as e:  # noqa: BLE001 - an authorizer failure is the decision's error
        return AuthzDecision(False, "", str(e) or type(e).__name__)
    return AuthzDecision(bool(d.allowed) and not d.no_opinion, d.reason)


def _no(name: str) -> CELEvalError:
    return CELEvalError(f"no such overload: {name}", TypeError, ())


def _str(x: Any) -> bool:
    return isinstance(x, str)


def _path(a: Any, p: Any) -> Any:
    return PathCheck(a, str(p)) if isinstance(a, Authz) and _str(p) else _no("path")


def _group(a: Any, g: Any) -> Any:
    return ResourceCheck(a, str(g)) if isinstance(a, Authz) and _str(g) else _no("group")


def _service_account(a: Any, ns: Any, name: Any) -> Any:
    if not (isinstance(a, Authz) and _str(ns) and _str(name)):
        return _no("serviceAccount")
    user = UserInfo(f"system:serviceaccount:{ns}:{name}",
                    groups=("system:serviceaccounts", f"system:serviceaccounts:{ns}"))
    return Authz(a.check_fn, user)


def _setter(field_name: str) -> Callable[[Any, Any], Any]:
    def set_(r: Any, value: Any) -> Any:
        if not isinstance(r, ResourceCheck) or not _str(value):
            return _no(field_name)
        return replace(r, **{field_name: str(value)})
    return set_


def _check(c: Any, verb: Any) -> Any:
    if not _str(verb):
        return _no("check")
    if isinstance(c, PathCheck):
        return _ask(c.authz, Attributes(str(verb), "", "", "", path=c.path, resource_request=False))
    if isinstance(c, ResourceCheck):
        return _ask(c.authz, Attributes(str(verb), c.group, "*", c.resource, c.subresource, c.namespace, c.name))
    return _no("check")


def _decision(name: str, fn: Callable[[AuthzDecision], Any]) -> Callable[[Any], Any]:
    def get(d: Any) -> Any:
        return fn(d) if isinstance(d, AuthzDecision) else _no(name)
    return get


AUTHZ_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "path": _path, "group": _group, "serviceAccount": _service_account,
    "resource": _setter("resource"), "subresource": _setter("subresource"),
    "namespace": _setter("namespace"), "name": _setter("name"), "check": _check,
    "allowed": _decision("allowed", lambda d: celtypes.BoolType(d.allowed)),
    "reason": _decision("reason", lambda d: celtypes.StringType(d.reason)),
    "errored": _decision("errored", lambda d: celtypes.BoolType(bool(d.error))),
    "error": _decision("error", lambda d: celtypes.StringType(d.error)),
}
