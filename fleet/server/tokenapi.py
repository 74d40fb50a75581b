"""The token APIs: TokenRequest, TokenReview, SelfSubjectReview, OIDC discovery.

Resources served without storage, as kube-apiserver serves them:

* `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token` (TokenRequest,
  pkg/registry/core/serviceaccount/storage/token.go): a bound token for the
  ServiceAccount, optionally bound to a Pod, Secret or Node that must exist
  (and match `uid` when given); `kubectl create token`.
* `POST /apis/authentication.k8s.io/v1/tokenreviews` (pkg/registry/authentication/
  tokenreview): the server's own authenticators judge `spec.token` for
  `spec.audiences` (default: the API audiences).
* `POST /apis/authentication.k8s.io/v1/selfsubjectreviews`: who the requester is
  (`kubectl auth whoami`).
* `GET /.well-known/openid-configuration` and `GET /openid/v1/jwks`: the
  ServiceAccount issuer's OIDC discovery document and signing keys, so a
  workload's token can be verified outside the cluster (workload identity
  federation), as pkg/serviceaccount/openidmetadata.go serves them.

All answers are 201 (the reviews and token requests) or 200 JSON; errors are
kube-apiserver's Status objects with its messages.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fleet.admission import AdmissionChain
from fleet.api import errors, meta
from fleet.api import validation as v
from fleet.auth import (
    Attributes,
    AuthenticationError,
    Credentials,
    UnionAuthenticator,
    UserInfo,
    with_authenticated_group,
)
from fleet.auth.serviceaccount import (
    EXPIRATION_EXTENSION_SECONDS,
    WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS,
    Binding,
    ObjectGetter,
    ObjectRef,
    TokenIssuer,
)
from fleet.server.http import Req, Resp
from fleet.server.request_params import decode_body, is_dry_run, warning_headers
from fleet.server.routes import Route

AUTHN_GROUP = "authentication.k8s.io"
AUTHN_VERSION = f"{AUTHN_GROUP}/v1"
DEFAULT_EXPIRATION_SECONDS = 3600  # SetDefaults_TokenRequestSpec
MIN_EXPIRATION_SECONDS = 600
MAX_EXPIRATION_SECONDS = 1 << 32
OPENID_CONFIGURATION_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"

Handler = Callable[[Req, Route, str, UserInfo, Any], Awaitable[Resp]]


def user_info_json(user: UserInfo) -> dict[str, Any]:
    """authentication/v1 UserInfo."""
    out: dict[str, Any] = {"username": user.name}
    if user.uid:
        out["uid"] = user.uid
    if user.groups:
        out["groups"] = list(user.groups)
    if user.extra:
        out["extra"] = {k: list(vs) for k, vs in user.extra.items()}
    return out


def _review_body(req: Req, kind: str) -> dict[str, Any]:
    body = decode_body(req)
    if not isinstance(body, dict):
        raise errors.BadRequest("the body must be a JSON object (got " + type(body).__name__ + ")")
    api_version, got = body.get("apiVersion"), body.get("kind")
    if api_version is None and got is None:
        body["apiVersion"], body["kind"] = AUTHN_VERSION, kind
    elif got != kind or api_version != AUTHN_VERSION:
        raise errors.BadRequest(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({AUTHN_VERSION})" if api_version != AUTHN_VERSION else
            f"the kind in the data ({got}) does not match the expected kind ({kind})")
    for key in ("metadata", "spec", "status"):
        if body.get(key) is None:
            body[key] = {}
        elif not isinstance(body[key], dict):
            raise errors.BadRequest(f"{kind}.{key}: expected an object")
    return body


def _strings(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise errors.BadRequest(f"{path}: expected an array of strings")
    return list(value)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _gvk_string(api_version: str, kind: str) -> str:
    """schema.GroupVersionKind.String() of FromAPIVersionAndKind."""
    group, _, version = api_version.rpartition("/") if "/" in api_version else ("", "", api_version)
    return f"{group}/{version}, Kind={kind}"


async def review_token(authenticator: UnionAuthenticator, token: str, audiences: Sequence[str],
                       api_audiences: Sequence[str]) -> tuple[UserInfo | None, list[str], str]:
    """(user, audiences, error) of `token` for `audiences` through the server's authenticators,
    as a TokenReview sees it.  Audience-aware authenticators (ServiceAccount tokens) check
    the audiences themselves; the others are audience-agnostic: they answer only when the
    requested audiences include one of the API's (apiserver's WrapAudienceAgnosticToken)."""
    creds = Credentials({"authorization": f"Bearer {token}"})
    agnostic = [a for a in audiences if a in api_audiences] if audiences else list(api_audiences)
    failure: AuthenticationError | None = None
    for a in authenticator.authenticators:
        try:
            by_token = getattr(a, "authenticate_token", None)
            if by_token is not None:
                result = await by_token(token, list(audiences) or None)
                if result is not None:
                    return with_authenticated_group(result.user), list(result.audiences), ""
                continue
            if audiences and not agnostic:
                continue
            user = await a.authenticate(creds)
        except AuthenticationError as e:
            failure = failure or e
            continue
        if user is not None:
            return with_authenticated_group(user), agnostic, ""
    return None, [], str(failure) if failure is not None else ""


class TokenAPI:
    """The handlers above, over the issuer, the store and the authenticator union."""

    def __init__(self, issuer: TokenIssuer, get: ObjectGetter, authenticator: UnionAuthenticator | None, *,
                 api_audiences: Sequence[str], max_expiration_seconds: int = 0,
                 extend_expiration: bool = True, jwks_uri: str = "", admission: AdmissionChain | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.issuer = issuer
        self.get = get
        self.authenticator = authenticator
        self.api_audiences = list(api_audiences)
        self.max_expiration_seconds = max_expiration_seconds
        self.extend_expiration = extend_expiration
        self.jwks_uri = jwks_uri or issuer.issuer.rstrip("/") + JWKS_PATH
        self.clock = clock
        # The server's admission chain: its validating half judges each TokenRequest
        # (kube-apiserver's createValidation; NodeRestriction limits what a node may ask).
        self.admission = admission

    def handlers(self) -> dict[tuple[str, str, str, str], Handler]:
        return {
            ("", "v1", "serviceaccounts", "token"): self.token_request,
            (AUTHN_GROUP, "v1", "tokenreviews", ""): self.token_review,
            (AUTHN_GROUP, "v1", "selfsubjectreviews", ""): self.self_subject_review,
        }

    def paths(self) -> dict[str, Callable[[Req], Awaitable[Resp]]]:
        return {OPENID_CONFIGURATION_PATH: self.openid_configuration, JWKS_PATH: self.jwks}

    # ------------------------------------------------------------ TokenRequest

    async def token_request(self, req: Req, route: Route, verb: str, user: UserInfo, info: Any) -> Resp:
        if verb != "create" or route.namespace is None or route.name is None:
            raise errors.MethodNotAllowed(f"{req.method} is not supported on serviceaccounts/token")
        namespace, name = route.namespace, route.name
        tr = _review_body(req, "TokenRequest")
        md, spec = tr["metadata"], tr["spec"]
        if md.get("name") and md["name"] != name:
            raise errors.Invalid.for_object("TokenRequest", AUTHN_GROUP, name, [v.invalid(
                "metadata.name", md["name"], "must match the service account name if specified")])
        if md.get("namespace") and md["namespace"] != namespace:
            raise errors.Invalid.for_object("TokenRequest", AUTHN_GROUP, name, [v.invalid(
                "metadata.namespace", md["namespace"], "must match the service account namespace if specified")])
        sa = await self.get("serviceaccounts", namespace, name)
        if sa is None:
            raise errors.NotFound(f'serviceaccounts "{name}" not found', name=name, kind="serviceaccounts")
        if md.get("uid") and md["uid"] != _uid(sa):
            raise errors.Conflict(
                f'Operation cannot be fulfilled on TokenRequest.{AUTHN_GROUP} "{name}": the UID in the token '
                f"request ({md['uid']}) does not match the UID of the service account ({_uid(sa)})",
                name=name, group=AUTHN_GROUP, kind="TokenRequest")
        audiences = _strings(spec.get("audiences"), "spec.audiences") or list(self.api_audiences)
        spec["audiences"] = audiences
        exp = spec.get("expirationSeconds")
        if exp is None:
            exp = spec["expirationSeconds"] = DEFAULT_EXPIRATION_SECONDS
        if isinstance(exp, bool) or not isinstance(exp, int):
            raise errors.BadRequest("spec.expirationSeconds: expected an integer")
        now = self.clock()
        md.update(name=name, namespace=namespace, uid=md.get("uid") or _uid(sa),
                  creationTimestamp=meta.format_time(now))
        tr["status"] = {}
        causes = []
        if exp < MIN_EXPIRATION_SECONDS:
            causes.append(v.invalid("spec.expirationSeconds", exp, "may not specify a duration less than 10 minutes"))
        if exp > MAX_EXPIRATION_SECONDS:
            causes.append(v.invalid("spec.expirationSeconds", exp,
                                    "may not specify a duration larger than 2^32 seconds"))
        if causes:
            raise errors.Invalid.for_object("TokenRequest", AUTHN_GROUP, "", causes)
        if self.admission is not None:
            attrs = Attributes("create", "", "v1", "serviceaccounts", "token", namespace, name,
                               dry_run=is_dry_run(req))
            await self.admission.validate(attrs, user, copy.deepcopy(tr), None)
        binding = await self._binding(spec.get("boundObjectRef"), namespace, name)
        warnings = []
        if self.max_expiration_seconds > 0 and exp > self.max_expiration_seconds:
            warnings.append(f"requested expiration of {exp} seconds shortened to "
                            f"{self.max_expiration_seconds} seconds")
            exp = spec["expirationSeconds"] = self.max_expiration_seconds
        warnafter, token_exp = 0, exp
        if (self.extend_expiration and binding.pod is not None and exp == WARN_ONLY_BOUND_TOKEN_EXPIRATION_SECONDS
                and all(a in self.api_audiences for a in audiences)):
            warnafter, token_exp = exp, max(EXPIRATION_EXTENSION_SECONDS, self.max_expiration_seconds)
        token, _ = self.issuer.issue(namespace=namespace, sa_name=name, sa_uid=_uid(sa), audiences=audiences,
                                     expiration_seconds=token_exp, binding=binding, warnafter=warnafter,
                                     now=now)
        tr["status"] = {"token": token, "expirationTimestamp": meta.format_time(int(now) + exp)}
        return Resp.json(201, tr, warning_headers(warnings) if warnings else None)

    async def _binding(self, ref: Any, namespace: str, sa_name: str) -> Binding:
        if ref is None:
            return Binding()
        if not isinstance(ref, dict):
            raise errors.BadRequest("spec.boundObjectRef: expected an object")
        kind, api_version = str(ref.get("kind") or ""), str(ref.get("apiVersion") or "")
        name, want_uid = str(ref.get("name") or ""), str(ref.get("uid") or "")
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        plural = {"Pod": "pods", "Secret": "secrets", "Node": "nodes"}.get(kind) if group == "" else None
        if plural is None:
            raise errors.BadRequest(f"cannot bind token to object of type {_gvk_string(api_version, kind)}")
        obj = await self.get(plural, "" if kind == "Node" else namespace, name)
        if obj is None:
            raise errors.NotFound(f'{plural} "{name}" not found', name=name, kind=plural)
        binding = Binding()
        if kind == "Pod":
            if (obj.get("spec") or {}).get("serviceAccountName") != sa_name:
                raise errors.BadRequest(f'cannot bind token for serviceaccount "{sa_name}" to pod running '
                                        "with different serviceaccount name.")
            node = None
            node_name = (obj.get("spec") or {}).get("nodeName")
            if isinstance(node_name, str) and node_name:
                n = await self.get("nodes", "", node_name)
                # A pod's node that is gone still names the node, without a uid.
                node = ObjectRef(node_name, _uid(n) if n is not None else "")
            binding = Binding(pod=ObjectRef(name, _uid(obj)), node=node)
        elif kind == "Secret":
            binding = Binding(secret=ObjectRef(name, _uid(obj)))
        else:
            binding = Binding(node=ObjectRef(name, _uid(obj)))
        if want_uid and want_uid != _uid(obj):
            raise errors.Conflict(
                f'Operation cannot be fulfilled on {kind} "{name}": the UID in the bound object reference '
                f"({want_uid}) does not match the UID in record. The object might have been deleted and then "
                "recreated", name=name, kind=kind)
        return binding

    # ------------------------------------------------------------ reviews

    async def token_review(self, req: Req, route: Route, verb: str, user: UserInfo, info: Any) -> Resp:
        if verb != "create":
            raise errors.MethodNotAllowed(f"{verb} is not supported on tokenreviews.{AUTHN_GROUP}")
        review = _review_body(req, "TokenReview")
        spec = review["spec"]
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise errors.BadRequest("token is required for TokenReview in authentication")
        audiences = _strings(spec.get("audiences"), "spec.audiences")
        assert self.authenticator is not None, "TokenAPI.authenticator is set by the server's assembly"
        found, auds, error = await review_token(self.authenticator, token, audiences or self.api_audiences,
                                                self.api_audiences)
        status: dict[str, Any] = {"authenticated": found is not None, "user": {}}
        if error:
            status["error"] = error
        if found is not None:
            status["user"] = user_info_json(found)
            status["audiences"] = auds
        review["status"] = status
        review["metadata"].setdefault("creationTimestamp", None)
        return Resp.json(201, review)

    async def self_subject_review(self, req: Req, route: Route, verb: str, user: UserInfo, info: Any) -> Resp:
        if verb != "create":
            raise errors.MethodNotAllowed(f"{verb} is not supported on selfsubjectreviews.{AUTHN_GROUP}")
        review = _review_body(req, "SelfSubjectReview")
        review["metadata"]["creationTimestamp"] = meta.format_time(self.clock())
        review["status"] = {"userInfo": user_info_json(user)}
        return Resp.json(201, review)

    # ------------------------------------------------------------ OIDC discovery

    def openid_document(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer.issuer,
            "jwks_uri": self.jwks_uri,
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": self.issuer.keys.algorithms(),
        }

    async def openid_configuration(self, req: Req) -> Resp:
        return Resp(200, json.dumps(self.openid_document()).encode(), "application/json",
                    {"Cache-Control": "public, max-age=3600"})

    async def jwks(self, req: Req) -> Resp:
        return Resp(200, json.dumps(self.issuer.keys.jwks()).encode(), "application/jwk-set+json",
                    {"Cache-Control": "public, max-age=3600"})
