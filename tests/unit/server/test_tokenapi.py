"""fleet/server/tokenapi.py through the API pipeline: TokenRequest (serviceaccounts/token),
TokenReview, SelfSubjectReview, the issuer's OIDC discovery and JWKS, as kube-apiserver
answers them; wired by fleet/server/security.py `build`, as `fleet server` does."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt
import pytest

from fleet.api import errors, protobuf
from fleet.server import security
from fleet.server.security import SecurityConfig
from fleet.testing.apiserver import TOKEN, InProcessAPI, open_api

ISS = "https://kubernetes.default.svc.cluster.local"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# Bodies kubectl 1.32 POSTed (captured with -v=9) for:
KUBECTL_CREATE_TOKEN = base64.b64decode(  # kubectl create token default
    "azhzAAooChhhdXRoZW50aWNhdGlvbi5rOHMuaW8vdjESDFRva2VuUmVxdWVzdBIaChAKABIAGgAiACoAMgA4AEIAEgAaBAoAEgAaACIA")
KUBECTL_CREATE_TOKEN_BOUND = base64.b64decode(  # ... --audience a1 --audience a2 --duration 20m
    # --bound-object-kind Pod --bound-object-name p1 --bound-object-uid u-1
    "azhzAAooChhhdXRoZW50aWNhdGlvbi5rOHMuaW8vdjESDFRva2VuUmVxdWVzdBI5ChAKABIAGgAiACoAMgA4AEIAEh8KAmExCgJh"
    "MhoSCgNQb2QSAnYxGgJwMSIDdS0xILAJGgQKABIAGgAiAA==")
KUBECTL_WHOAMI = base64.b64decode(  # kubectl auth whoami
    "azhzAAotChhhdXRoZW50aWNhdGlvbi5rOHMuaW8vdjESEVNlbGZTdWJqZWN0UmV2aWV3EhoKEAoAEgAaACIAKgAyADgAQgASBgoE"
    "CgASABoAIgA=")


async def wire(api: InProcessAPI, tmp_path: Path, cfg: SecurityConfig | None = None) -> security.Security:
    sec = await security.build(cfg or SecurityConfig(), data_dir=tmp_path, store=api.store,
                               registry=api.server.registry, admin_token=TOKEN)
    api.server.authenticator = sec.authenticator
    api.server.resource_handlers.update(sec.handlers)
    api.server.path_handlers.update(sec.paths)
    return sec


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[InProcessAPI]:
    async with open_api(tmp_path, namespace_controller=False) as a:
        await wire(a, tmp_path)
        yield a


async def make(api: InProcessAPI, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    status, body = await api.json("POST", path, obj)
    assert status == 201, body
    return body


async def service_account(api: InProcessAPI, name: str = "robot", ns: str = "default") -> dict[str, Any]:
    return await make(api, f"/api/v1/namespaces/{ns}/serviceaccounts",
                      {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})


def token_request(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


TOKEN_PATH = "/api/v1/namespaces/default/serviceaccounts/robot/token"


async def test_token_request_issues_a_token_the_api_accepts_until_the_account_is_deleted(api: InProcessAPI) -> None:
    sa = await service_account(api)
    status, tr = await api.json("POST", TOKEN_PATH, token_request())
    assert status == 201, tr
    assert tr["kind"] == "TokenRequest" and tr["spec"] == {"audiences": [ISS], "expirationSeconds": 3600}
    assert tr["metadata"]["name"] == "robot" and tr["metadata"]["uid"] == sa["metadata"]["uid"]
    token = tr["status"]["token"]
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 3600
    assert tr["status"]["expirationTimestamp"] == datetime.fromtimestamp(claims["exp"], UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    status, body = await api.json("GET", "/api/v1/namespaces/default/serviceaccounts", token=token)
    assert status == 200, body
    status, _ = await api.json("DELETE", "/api/v1/namespaces/default/serviceaccounts/robot")
    assert status == 200
    status, body = await api.json("GET", "/api/v1/namespaces/default/serviceaccounts", token=token)
    assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")


async def test_kubectl_protobuf_bodies(api: InProcessAPI) -> None:
    await service_account(api, "default")
    resp = await api.call("POST", "/api/v1/namespaces/default/serviceaccounts/default/token", KUBECTL_CREATE_TOKEN,
                          content_type=PROTOBUF)
    assert resp.status == 201, resp.body
    assert json.loads(resp.body)["status"]["token"].count(".") == 2
    # Bound to a pod that does not exist: 404 as kube-apiserver answers.
    resp = await api.call("POST", "/api/v1/namespaces/default/serviceaccounts/default/token",
                          KUBECTL_CREATE_TOKEN_BOUND, content_type=PROTOBUF)
    assert resp.status == 404 and json.loads(resp.body)["message"] == 'pods "p1" not found'
    resp = await api.call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", KUBECTL_WHOAMI,
                          content_type=PROTOBUF)
    assert resp.status == 201
    review = json.loads(resp.body)
    assert review["kind"] == "SelfSubjectReview"
    assert review["status"]["userInfo"] == {"username": "system:admin",
                                            "groups": ["system:masters", "system:authenticated"]}


async def test_token_request_validation(api: InProcessAPI) -> None:
    await service_account(api)
    status, body = await api.json("POST", TOKEN_PATH, token_request(expirationSeconds=599))
    assert status == 422
    assert body["message"] == ('TokenRequest.authentication.k8s.io "" is invalid: spec.expirationSeconds: '
                               "Invalid value: 599: may not specify a duration less than 10 minutes")
    status, body = await api.json("POST", "/api/v1/namespaces/default/serviceaccounts/ghost/token", token_request())
    assert (status, body["message"]) == (404, 'serviceaccounts "ghost" not found')
    status, body = await api.json("POST", TOKEN_PATH, {**token_request(), "metadata": {"name": "other"}})
    assert status == 422 and "must match the service account name if specified" in body["message"]
    status, body = await api.json("POST", TOKEN_PATH, token_request(
        boundObjectRef={"kind": "Deployment", "apiVersion": "apps/v1", "name": "d"}))
    assert (status, body["message"]) == (400, "cannot bind token to object of type apps/v1, Kind=Deployment")
    status, body = await api.json("GET", TOKEN_PATH)
    assert status == 405


async def test_bound_pod_checks_and_token_lifetime(api: InProcessAPI) -> None:
    await service_account(api)
    await service_account(api, "other")
    pod = await make(api, "/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
        "spec": {"serviceAccountName": "robot", "containers": [{"name": "c", "image": "busybox"}]}})
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "p1"}
    status, body = await api.json("POST", "/api/v1/namespaces/default/serviceaccounts/other/token",
                                  token_request(boundObjectRef=ref))
    assert (status, body["message"]) == (400, 'cannot bind token for serviceaccount "other" to pod running with '
                                               "different serviceaccount name.")
    status, body = await api.json("POST", TOKEN_PATH, token_request(boundObjectRef={**ref, "uid": "nope"}))
    assert status == 409 and body["message"] == (
        'Operation cannot be fulfilled on Pod "p1": the UID in the bound object reference (nope) does not match '
        "the UID in record. The object might have been deleted and then recreated")
    status, tr = await api.json("POST", TOKEN_PATH, token_request(boundObjectRef={**ref, "uid": pod["metadata"]["uid"]},
                                                                   audiences=["vault"], expirationSeconds=1200))
    assert status == 201, tr
    c = jwt.decode(tr["status"]["token"], options={"verify_signature": False})
    assert c["aud"] == ["vault"] and c["exp"] - c["iat"] == 1200
    assert c["kubernetes.io"]["pod"] == {"name": "p1", "uid": pod["metadata"]["uid"]}
    # A token for another audience does not open the API.
    status, _ = await api.json("GET", "/api/v1/namespaces", token=tr["status"]["token"])
    assert status == 401
    # The kubelet's projected-token request (3607 s, API audience): warnafter + a year.
    status, tr = await api.json("POST", TOKEN_PATH, token_request(boundObjectRef=ref, expirationSeconds=3607))
    c = jwt.decode(tr["status"]["token"], options={"verify_signature": False})
    assert c["kubernetes.io"]["warnafter"] == c["iat"] + 3607 and c["exp"] - c["iat"] == 365 * 24 * 3600
    # The pod is deleted: its tokens stop working.
    status, _ = await api.json("GET", "/api/v1/namespaces", token=tr["status"]["token"])
    assert status == 200
    status, _ = await api.json("DELETE", "/api/v1/namespaces/default/pods/p1", query={"gracePeriodSeconds": "0"})
    assert status == 200
    status, _ = await api.json("GET", "/api/v1/namespaces", token=tr["status"]["token"])
    assert status == 401


async def test_max_expiration_shortens_with_a_warning(tmp_path: Path) -> None:
    async with open_api(tmp_path, namespace_controller=False) as api:
        cfg = SecurityConfig()
        cfg.service_accounts.max_token_expiration = 7200
        await wire(api, tmp_path, cfg)
        await service_account(api)
        resp = await api.call("POST", TOKEN_PATH, token_request(expirationSeconds=86400))
        assert resp.status == 201
        assert resp.headers["Warning"] == '299 - "requested expiration of 86400 seconds shortened to 7200 seconds"'
        tr = json.loads(resp.body)
        assert tr["spec"]["expirationSeconds"] == 7200
        c = jwt.decode(tr["status"]["token"], options={"verify_signature": False})
        assert c["exp"] - c["iat"] == 7200


async def test_token_review(api: InProcessAPI) -> None:
    sa = await service_account(api)
    status, tr = await api.json("POST", TOKEN_PATH, token_request(audiences=["vault", ISS]))
    token = tr["status"]["token"]
    path = "/apis/authentication.k8s.io/v1/tokenreviews"

    def review(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}

    status, body = await api.json("POST", path, review(token=token))
    assert status == 201, body
    assert body["status"]["authenticated"] is True and body["status"]["audiences"] == [ISS]
    user = body["status"]["user"]
    assert user["username"] == "system:serviceaccount:default:robot" and user["uid"] == sa["metadata"]["uid"]
    assert user["groups"] == ["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"]
    status, body = await api.json("POST", path, review(token=token, audiences=["vault"]))
    assert body["status"]["authenticated"] is True and body["status"]["audiences"] == ["vault"]
    status, body = await api.json("POST", path, review(token=token, audiences=["elsewhere"]))
    assert body["status"]["authenticated"] is False
    assert "is invalid for the target audiences" in body["status"]["error"]
    # The admin token is audience-agnostic: it reviews for the API's audiences only.
    status, body = await api.json("POST", path, review(token=TOKEN))
    assert body["status"]["user"]["username"] == "system:admin" and body["status"]["audiences"] == [ISS]
    status, body = await api.json("POST", path, review(token=TOKEN, audiences=["vault"]))
    assert body["status"]["authenticated"] is False and "error" not in body["status"]
    status, body = await api.json("POST", path, review(token="garbage"))
    assert status == 201 and body["status"] == {"authenticated": False, "user": {}}
    status, body = await api.json("POST", path, review())
    assert (status, body["message"]) == (400, "token is required for TokenReview in authentication")
    status, body = await api.json("GET", path)
    assert status == 405


async def test_oidc_discovery_and_jwks_verify_issued_tokens(api: InProcessAPI) -> None:
    await service_account(api)
    status, doc = await api.json("GET", "/.well-known/openid-configuration")
    assert status == 200
    assert doc == {"issuer": ISS, "jwks_uri": ISS + "/openid/v1/jwks", "response_types_supported": ["id_token"],
                   "subject_types_supported": ["public"], "id_token_signing_alg_values_supported": ["RS256"]}
    resp = await api.call("GET", "/openid/v1/jwks")
    assert resp.status == 200 and resp.content_type == "application/jwk-set+json"
    jwks = jwt.PyJWKSet.from_json(resp.body.decode())
    _, tr = await api.json("POST", TOKEN_PATH, token_request(audiences=["sts.example.com"]))
    token = tr["status"]["token"]
    key = jwks[jwt.get_unverified_header(token)["kid"]]
    claims = jwt.decode(token, key.key, algorithms=["RS256"], audience="sts.example.com", issuer=ISS)
    assert claims["sub"] == "system:serviceaccount:default:robot"
    status, root = await api.json("GET", "/")
    assert {"/.well-known/openid-configuration", "/openid/v1/jwks"} <= set(root["paths"])
    # Anonymous requests are refused (no --anonymous-auth).
    status, _ = await api.json("GET", "/openid/v1/jwks", token=None)
    assert status == 401


async def test_discovery_lists_the_token_apis(api: InProcessAPI) -> None:
    _, core = await api.json("GET", "/api/v1")
    token = [r for r in core["resources"] if r["name"] == "serviceaccounts/token"]
    assert token == [{"name": "serviceaccounts/token", "singularName": "", "namespaced": True,
                      "kind": "TokenRequest", "verbs": ["create"], "group": "authentication.k8s.io",
                      "version": "v1"}]
    _, authn = await api.json("GET", "/apis/authentication.k8s.io/v1")
    assert {(r["name"], r["kind"], tuple(r["verbs"])) for r in authn["resources"]} == {
        ("tokenreviews", "TokenReview", ("create",)), ("selfsubjectreviews", "SelfSubjectReview", ("create",))}


async def test_token_requests_go_through_validating_admission(tmp_path: Path) -> None:
    seen: list[tuple[Any, str, dict[str, Any]]] = []

    class NoTokensForRobots:
        name = "NoTokensForRobots"

        async def validate(self, attrs: Any, user: Any, obj: Any, old: Any) -> None:
            if attrs.subresource != "token":
                return
            seen.append((attrs, user.name, obj))
            if attrs.name == "robot":
                raise errors.Forbidden('serviceaccounts "robot" is forbidden: no tokens for robots')

    async with open_api(tmp_path, namespace_controller=False) as api:
        api.server.admission.validating.append(NoTokensForRobots())
        sec = await security.build(SecurityConfig(), data_dir=tmp_path, store=api.store,
                                   registry=api.server.registry, admin_token=TOKEN, admission=api.server.admission)
        api.server.authenticator = sec.authenticator
        api.server.resource_handlers.update(sec.handlers)
        await service_account(api)
        await service_account(api, "human")
        status, body = await api.json("POST", TOKEN_PATH, token_request())
        assert (status, body["message"]) == (403, 'serviceaccounts "robot" is forbidden: no tokens for robots')
        status, _ = await api.json("POST", "/api/v1/namespaces/default/serviceaccounts/human/token",
                                   token_request(audiences=["a"]))
        assert status == 201
    attrs, username, obj = seen[-1]
    assert (attrs.verb, attrs.resource, attrs.subresource, attrs.namespace, attrs.name) == (
        "create", "serviceaccounts", "token", "default", "human")
    assert username == "system:admin"
    assert obj["kind"] == "TokenRequest" and obj["spec"]["audiences"] == ["a"] and obj["status"] == {}


async def test_secret_and_node_bound_token_requests(api: InProcessAPI) -> None:
    await service_account(api)
    secret = await make(api, "/api/v1/namespaces/default/secrets",
                        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}})
    node = await make(api, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    for ref, obj, path in (({"kind": "Secret", "apiVersion": "v1", "name": "s1"}, secret,
                            "/api/v1/namespaces/default/secrets/s1"),
                           ({"kind": "Node", "apiVersion": "v1", "name": "n1"}, node, "/api/v1/nodes/n1")):
        status, tr = await api.json("POST", TOKEN_PATH, token_request(boundObjectRef=ref))
        assert status == 201, tr
        token = tr["status"]["token"]
        bound = jwt.decode(token, options={"verify_signature": False})["kubernetes.io"][ref["kind"].lower()]
        assert bound == {"name": ref["name"], "uid": obj["metadata"]["uid"]}
        status, _ = await api.json("GET", "/api/v1/namespaces", token=token)
        assert status == 200
        status, _ = await api.json("DELETE", path)
        assert status == 200
        status, _ = await api.json("GET", "/api/v1/namespaces", token=token)
        assert status == 401


def test_kubectl_protobuf_bodies_decode_as_their_json() -> None:
    assert protobuf.decode_body(KUBECTL_CREATE_TOKEN) == {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {}, "spec": {},
        "status": {}}
    assert protobuf.decode_body(KUBECTL_CREATE_TOKEN_BOUND) == {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {},
        "spec": {"audiences": ["a1", "a2"], "expirationSeconds": 1200,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": "u-1"}},
        "status": {}}
    assert protobuf.decode_body(KUBECTL_WHOAMI) == {
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {},
        "status": {"userInfo": {}}}
