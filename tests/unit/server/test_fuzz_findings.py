"""Regression tests for what the authorization-aware fuzzing campaign found
(tests/e2e/test_fuzz_*.py; docs/reliability.md lists the findings)."""

from __future__ import annotations

import base64
import json

import pytest

from fleet.api.registry import default_registry
from fleet.server.openapi import document
from fleet.testing.apiserver import open_api

METHOD_VERBS = {("get", False): "list", ("post", False): "create", ("delete", False): "deletecollection",
                ("get", True): "get", ("put", True): "update", ("patch", True): "patch", ("delete", True): "delete"}


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def test_deleting_the_namespace_collection_is_405_and_deletes_nothing(api):
    # kube-apiserver's namespace storage has no DeleteCollection; Fleet deleted namespaces
    # one by one until it met a protected one.
    await api.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": "aaa"}})
    code, body = await api.json("DELETE", "/api/v1/namespaces")
    assert code == 405 and body["reason"] == "MethodNotAllowed", body
    code, body = await api.json("GET", "/api/v1/namespaces/aaa")
    assert code == 200 and not body["metadata"].get("deletionTimestamp")
    code, disc = await api.json("GET", "/api/v1")
    ns = next(r for r in disc["resources"] if r["name"] == "namespaces")
    assert "deletecollection" not in ns["verbs"]


def test_served_openapi_lists_only_the_verbs_each_kind_serves():
    # The served OpenAPI offered get/list/update/patch/delete of the reviews and writes of
    # metrics.k8s.io; the server answers those 405.
    registry = default_registry()
    seen = 0
    for info in registry.all():
        doc = document(registry, info.group, info.version)
        assert doc is not None
        for path, item in doc["paths"].items():
            if path.rstrip("/").split("/")[-1 if not path.endswith("}") else -2] != info.plural:
                continue
            if info.namespaced != ("{namespace}" in path) and "{namespace}" in path:
                continue
            for method in ("get", "post", "put", "patch", "delete"):
                if method in item:
                    verb = METHOD_VERBS[(method, path.endswith("/{name}"))]
                    assert verb in info.verbs, (path, method, info.verbs)
                    seen += 1
    assert seen > 300
    doc = document(registry, "authorization.k8s.io", "v1")
    assert doc is not None
    assert set(doc["paths"]["/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"]) == {"parameters", "post"}
    assert "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews/{name}" not in doc["paths"]
    doc = document(registry, "metrics.k8s.io", "v1beta1")
    assert doc is not None
    assert set(doc["paths"]["/apis/metrics.k8s.io/v1beta1/nodes/{name}"]) == {"parameters", "get"}
    doc = document(registry, "", "v1")
    assert doc is not None
    assert "delete" not in doc["paths"]["/api/v1/namespaces"]
    assert "delete" in doc["paths"]["/api/v1/namespaces/{name}"]


DEEP = b"[" * 5000 + b"]" * 5000


def test_a_bearer_token_nested_past_the_recursion_limit_is_not_a_service_account_token():
    # An unauthenticated client's token whose payload is `[[[[...`: a 500 with a traceback.
    from fleet.auth.serviceaccount import unverified_claims

    payload = base64.urlsafe_b64encode(DEEP).decode().rstrip("=")
    assert unverified_claims(f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln") is None


def test_audit_body_decoding_survives_deep_nesting():
    from fleet.auth.audit import decode_body

    assert decode_body(DEEP, "application/json") is None
    assert decode_body(b"a: " + DEEP + b"\n", "application/yaml") is None


def test_a_detached_signature_with_a_deep_header_does_not_verify():
    from fleet.auth.bootstrap import verify_detached_signature

    header = base64.urlsafe_b64encode(DEEP).decode().rstrip("=")
    assert verify_detached_signature("content", f"{header}..c2ln", "abcdef", "0123456789abcdef") is False


@pytest.mark.parametrize("iss", [["https://kubernetes.default.svc.cluster.local"], {"a": 1}, 5, None])
async def test_a_token_whose_issuer_is_not_a_string_is_not_ours(iss):
    # `iss` a list was `TypeError: unhashable type: 'list'`, a 500 for an unauthenticated client.
    from fleet.auth.serviceaccount import (
        ServiceAccountTokenAuthenticator,
        SigningKeys,
        new_signing_key,
    )

    async def get(plural, namespace, name):
        return None

    key = new_signing_key()
    auth = ServiceAccountTokenAuthenticator(SigningKeys(key, [key.public_key()]), get)
    header = base64.urlsafe_b64encode(b'{"alg":"RS256"}').decode().rstrip("=")
    payload = base64.urlsafe_b64encode(json.dumps({"iss": iss}).encode()).decode().rstrip("=")
    assert await auth.authenticate_token(f"{header}.{payload}.c2ln") is None


@pytest.mark.parametrize("body", [b"[" * 5000 + b"]" * 5000, None])
def test_a_webhook_answer_nested_past_the_recursion_limit_is_a_call_error(body):
    # A webhook answering `[[[[...` (or such a patch) was a 500 with a traceback, even
    # under failurePolicy Ignore; it is a failed call like any other garbage answer.
    from fleet.admission.webhook_review import CallError, parse_response

    if body is None:
        patch = base64.b64encode(b"[" * 5000 + b"]" * 5000).decode()
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": {"uid": "u", "allowed": True, "patchType": "JSONPatch",
                                        "patch": patch}}).encode()
    with pytest.raises(CallError, match="invalid"):
        parse_response(body, "u", mutating=True, obj={"metadata": {"name": "x"}})


@pytest.mark.parametrize(("code", "want"), [(1000, 400), (600, 400), (999, 400), (2**31 - 1, 400), (503, 503),
                                            (422, 422), (0, 400), (-5, 400)])
def test_a_denial_code_no_http_status_can_carry_is_400(code, want):
    # A webhook denying with code 1000 made the server write status 1000: h11 refused,
    # the connection died and the log had a traceback.
    from fleet.admission.webhook_review import denied

    assert denied("hook", {"code": code, "message": "no"}).code == want


@pytest.mark.parametrize("code", [2**31, 2**40, -(2**31) - 1])
def test_a_denial_code_past_int32_is_a_failed_call(code):
    from fleet.admission.webhook_review import CallError, parse_response

    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": {"uid": "u", "allowed": False, "status": {"code": code}}}).encode()
    with pytest.raises(CallError, match="int32"):
        parse_response(body, "u", mutating=True, obj=None)
