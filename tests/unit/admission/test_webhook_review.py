"""AdmissionReview v1 requests and what answers mean (fleet/admission/webhook_review.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from fleet.admission.webhook_review import (
    CallError,
    build_review,
    call_failed,
    denied,
    dry_run_unsupported,
    parse_response,
)
from fleet.auth import UserInfo

OBJ = {"metadata": {"name": "p", "labels": {"a": "1"}}}


def answer(uid: str = "u1", **resp: Any) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": {"uid": uid, **resp}}).encode()


def b64(ops: Any) -> str:
    return base64.b64encode(json.dumps(ops).encode()).decode()


def test_build_review() -> None:
    r = build_review(uid="u1", kind={"group": "", "version": "v1", "kind": "Pod"},
                     resource={"group": "", "version": "v1", "resource": "pods"}, subresource="",
                     name="p", namespace="ns", operation="CREATE",
                     user=UserInfo("alice", "id1", ("devs",)), obj=OBJ, old=None, dry_run=True)
    assert r["apiVersion"] == "admission.k8s.io/v1" and r["kind"] == "AdmissionReview"
    q = r["request"]
    assert q["uid"] == "u1" and q["operation"] == "CREATE" and q["name"] == "p" and q["namespace"] == "ns"
    assert q["requestKind"] == q["kind"] and q["requestResource"] == q["resource"]
    assert q["userInfo"] == {"username": "alice", "uid": "id1", "groups": ["devs"]}
    assert q["dryRun"] is True and q["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                                                    "dryRun": ["All"]}
    assert q["object"] == OBJ and q["oldObject"] is None and "subResource" not in q


def test_allowed_with_patch_warnings_and_annotations() -> None:
    ops = [{"op": "add", "path": "/metadata/labels/injected", "value": "yes"}]
    out = parse_response(answer(allowed=True, patchType="JSONPatch", patch=b64(ops), warnings=["careful"],
                                auditAnnotations={"k": "v"}), "u1", mutating=True, obj=OBJ)
    assert out.allowed and out.patched is not None
    assert out.patched["metadata"]["labels"] == {"a": "1", "injected": "yes"}
    assert OBJ["metadata"]["labels"] == {"a": "1"}  # the input is not modified
    assert out.warnings == ["careful"] and out.audit_annotations == {"k": "v"}


@pytest.mark.parametrize(("body", "mutating", "message"), [
    (b"not json", False, "received invalid webhook response"),
    (json.dumps({"kind": "AdmissionReview", "apiVersion": "v1"}).encode(), False,
     "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview"),
    (answer(uid="other", allowed=True), False, 'expected response.uid="u1", got "other"'),
    (answer(allowed="yes"), False, "allowed must be a boolean"),
    (answer(allowed=True, patchType="JSONPatch", patch=b64([])), False,
     "validating webhooks may not return patches"),
    (answer(allowed=True, patchType="Merge", patch=b64({})), True, 'expected patchType "JSONPatch"'),
    (answer(allowed=True, patchType="JSONPatch", patch="!!"), True, "received invalid patch"),
    (answer(allowed=True, patchType="JSONPatch", patch=b64([{"op": "test", "path": "/metadata/name",
                                                            "value": "q"}])), True, "JSON Patch"),
])
def test_garbage_is_a_call_error(body: bytes, mutating: bool, message: str) -> None:
    with pytest.raises(CallError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse_response(body, "u1", mutating=mutating, obj=OBJ)


def test_denied_messages() -> None:
    e = denied("deny.example.com", {"code": 403, "message": "no pods here", "reason": "Forbidden"})
    assert (e.code, e.message, e.reason) == (403, 'admission webhook "deny.example.com" denied the request: '
                                                  "no pods here", "Forbidden")
    e = denied("deny.example.com", {})
    assert (e.code, e.message) == (400, 'admission webhook "deny.example.com" denied the request without '
                                        "explanation")
    assert denied("d.example.com", {"code": 200}).code == 400
    e = denied("deny.example.com", {"code": 422, "reason": "Invalid"})
    assert (e.code, e.message) == (422, 'admission webhook "deny.example.com" denied the request: Invalid')


def test_call_failed_and_dry_run_messages() -> None:
    e = call_failed("dead.example.com", "context deadline exceeded")
    assert e.code == 500 and e.message == ('Internal error occurred: failed calling webhook "dead.example.com": '
                                           "context deadline exceeded")
    assert dry_run_unsupported("x.example.com").message == 'admission webhook "x.example.com" does not ' \
                                                           "support dry run"
