"""AdmissionReview v1: the request a webhook is sent and what its answer means.

Pure functions (no I/O), the counterpart of kube-apiserver's
k8s.io/apiserver/pkg/admission/plugin/webhook/request (`CreateV1AdmissionReview`,
`VerifyAdmissionResponse`) and `.../webhook/errors` (`ToStatusErr`), with their
messages:

- a refusal: `admission webhook "<name>" denied the request: <message>` (or
  `... denied the request without explanation`), with the response's code
  (400 when it gives none, or one below 400) and reason;
- a failed call (transport error, timeout, garbage answer, wrong uid, a patch from a
  validating webhook, an unsupported patch type): `failed calling webhook "<name>": <why>`,
  refused as an InternalError (`Internal error occurred: ...`) when failurePolicy is
  Fail, admitted with a warning when it is Ignore;
- a mutating answer's `patch`: base64 JSONPatch (RFC 6902) applied with Fleet's own
  implementation (fleet/api/patch.py).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from fleet.api import errors, patch
from fleet.auth import UserInfo

ADMISSION_API_VERSION = "admission.k8s.io/v1"


class CallError(Exception):
    """Calling the webhook failed (not a refusal): failurePolicy decides."""


@dataclass
class Outcome:
    """A webhook's (valid) answer."""

    allowed: bool
    patched: dict[str, Any] | None = None  # the object after the webhook's patch (mutating only)
    warnings: list[str] = field(default_factory=list)
    audit_annotations: dict[str, str] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)


def user_info(user: UserInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"username": user.name}
    if getattr(user, "uid", ""):
        out["uid"] = user.uid
    if user.groups:
        out["groups"] = list(user.groups)
    extra = getattr(user, "extra", None)
    if extra:
        out["extra"] = {k: list(v) for k, v in dict(extra).items()}
    return out


def operation_options(operation: str, dry_run: bool) -> dict[str, Any] | None:
    """The options object kube-apiserver sends (CreateOptions / UpdateOptions / DeleteOptions)."""
    kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(operation)
    if kind is None:
        return None
    out: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if dry_run:
        out["dryRun"] = ["All"]
    return out


def build_review(*, uid: str, kind: dict[str, str], resource: dict[str, str], subresource: str,
                 name: str, namespace: str, operation: str, user: UserInfo,
                 obj: dict[str, Any] | None, old: dict[str, Any] | None, dry_run: bool) -> dict[str, Any]:
    """An AdmissionReview v1 request (requestKind/requestResource equal kind/resource:
    Fleet serves one version of each resource, so nothing was converted)."""
    req: dict[str, Any] = {
        "uid": uid, "kind": kind, "resource": resource,
        "requestKind": kind, "requestResource": resource,
        "operation": operation, "userInfo": user_info(user),
        "object": obj, "oldObject": old, "dryRun": dry_run,
        "options": operation_options(operation, dry_run),
    }
    if subresource:
        req["subResource"] = subresource
        req["requestSubResource"] = subresource
    if name:
        req["name"] = name
    if namespace:
        req["namespace"] = namespace
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "request": req}


def parse_response(body: bytes, uid: str, *, mutating: bool, obj: dict[str, Any] | None) -> Outcome:
    """Check an answer and read it; raises CallError for anything malformed."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        # RecursionError: nested past Python's recursion limit (was a 500 with a traceback
        # whatever the failurePolicy).
        raise CallError(f"received invalid webhook response: {e}") from None
    if not isinstance(review, dict):
        raise CallError("received invalid webhook response: not a JSON object")
    if review.get("apiVersion") != ADMISSION_API_VERSION or review.get("kind") != "AdmissionReview":
        raise CallError(f'expected webhook response of {ADMISSION_API_VERSION}, Kind=AdmissionReview, got '
                        f'{review.get("apiVersion")}, Kind={review.get("kind")}')
    resp = review.get("response")
    if not isinstance(resp, dict):
        raise CallError("webhook response was absent")
    if resp.get("uid") != uid:
        raise CallError(f'expected response.uid="{uid}", got "{resp.get("uid", "")}"')
    allowed = resp.get("allowed")
    if not isinstance(allowed, bool):
        raise CallError("received invalid webhook response: allowed must be a boolean")
    warnings = [w for w in resp.get("warnings") or [] if isinstance(w, str)]
    annotations = resp.get("auditAnnotations") or {}
    if not isinstance(annotations, dict):
        raise CallError("received invalid webhook response: auditAnnotations must be a map of strings")
    status = resp.get("status") if isinstance(resp.get("status"), dict) else {}
    code = status.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and not -(2**31) <= code < 2**31:
        # Status.code is an int32: kube-apiserver cannot decode such an answer.
        raise CallError(f"received invalid webhook response: status.code {code} does not fit in an int32")
    out = Outcome(allowed, None, warnings, {str(k): str(v) for k, v in annotations.items()}, status)
    patch_b64, patch_type = resp.get("patch"), resp.get("patchType")
    if patch_b64 is None and patch_type is None:
        return out
    if not mutating:
        raise CallError("validating webhooks may not return patches")
    if patch_type != "JSONPatch":
        raise CallError(f'expected patchType "JSONPatch", got "{patch_type}"')
    if not isinstance(patch_b64, str):
        raise CallError("received invalid webhook response: patch must be a base64 string")
    try:
        ops = json.loads(base64.b64decode(patch_b64, validate=True))
    except (binascii.Error, ValueError, RecursionError) as e:
        raise CallError(f"received invalid patch: {e}") from None
    if not isinstance(ops, list):
        raise CallError("received invalid patch: json patch must be a list of operations")
    if allowed and obj is not None and ops:
        try:
            patched = patch.json_patch(obj, ops)
        except errors.APIError as e:
            raise CallError(f"JSON Patch: {e.message}") from None
        if not isinstance(patched, dict):
            raise CallError("the patch produced something that is not an object")
        out.patched = patched
    return out


def denied(name: str, status: dict[str, Any]) -> errors.APIError:
    """webhookerrors.ToStatusErr: the refusal kube-apiserver returns."""
    by = f'admission webhook "{name}" denied the request'
    message, reason = status.get("message"), status.get("reason")
    if isinstance(message, str) and message:
        text = f"{by}: {message}"
    elif isinstance(reason, str) and reason:
        text = f"{by}: {reason}"
    else:
        text = f"{by} without explanation"
    code = status.get("code")
    # "Make sure we don't return < 400 status codes along with a rejection."  Past 599 is
    # no HTTP status either (1000 and up cannot even be written: the connection died
    # with a traceback): 400 too, where kube-apiserver would write 600-999 as they are.
    if not isinstance(code, int) or isinstance(code, bool) or code < 400 or code > 599:
        code = 400
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return errors.APIError(text, code=code, reason=reason if isinstance(reason, str) else "",
                           causes=[c for c in causes or [] if isinstance(c, dict)])


def call_failed(name: str, err: str) -> errors.APIError:
    """failurePolicy Fail: apierrors.NewInternalError(ErrCallingWebhook)."""
    return errors.InternalError(f'Internal error occurred: failed calling webhook "{name}": {err}')


def ignored_warning(name: str, err: str) -> str:
    """failurePolicy Ignore: the request goes on; the client is told what was skipped."""
    return f'failed calling webhook "{name}": {err}; the request was admitted (failurePolicy Ignore)'


def dry_run_unsupported(name: str) -> errors.APIError:
    """webhookerrors.NewDryRunUnsupportedErr."""
    return errors.BadRequest(f'admission webhook "{name}" does not support dry run')


def supports_dry_run(hook: dict[str, Any]) -> bool:
    return hook.get("sideEffects") in ("None", "NoneOnDryRun")

