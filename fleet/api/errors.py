"""Kubernetes-style API errors.

Every failure the API reports is an `APIError`, which renders as a
`meta/v1 Status` object.  Layers below the HTTP server (store, registry,
patch, selectors) raise these so that the server has exactly one place that
turns an exception into a response.
"""

from __future__ import annotations

from typing import Any


def cause(field: str, message: str, reason: str = "FieldValueInvalid") -> dict[str, str]:
    """One entry of `Status.details.causes` (the shape kubectl prints)."""
    return {"reason": reason, "message": message, "field": field}


class APIError(Exception):
    """An error with an HTTP code and a Kubernetes `reason`."""

    code: int = 500
    reason: str = "InternalError"

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        reason: str | None = None,
        name: str | None = None,
        group: str | None = None,
        kind: str | None = None,
        causes: list[dict[str, str]] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes or []
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            out["details"] = details
        return out


class BadRequest(APIError):
    code, reason = 400, "BadRequest"


class Unauthorized(APIError):
    code, reason = 401, "Unauthorized"


class Forbidden(APIError):
    code, reason = 403, "Forbidden"


class NotFound(APIError):
    code, reason = 404, "NotFound"


class MethodNotAllowed(APIError):
    code, reason = 405, "MethodNotAllowed"


class NotAcceptable(APIError):
    code, reason = 406, "NotAcceptable"


class AlreadyExists(APIError):
    code, reason = 409, "AlreadyExists"


class Conflict(APIError):
    code, reason = 409, "Conflict"


class Gone(APIError):
    """410 Expired: a resourceVersion older than the compacted history."""

    code, reason = 410, "Expired"


class RequestEntityTooLarge(APIError):
    code, reason = 413, "RequestEntityTooLarge"


class UnsupportedMediaType(APIError):
    code, reason = 415, "UnsupportedMediaType"


class Invalid(APIError):
    """422 with one cause per bad field, message in the kube-apiserver form."""

    code, reason = 422, "Invalid"

    @classmethod
    def for_object(
        cls, kind: str, group: str, name: str, causes: list[dict[str, str]]
    ) -> Invalid:
        qual = f"{kind}.{group}" if group else kind
        parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
        if len(parts) == 1:
            detail = parts[0]
        else:
            detail = "[" + ", ".join(parts) + "]"
        return cls(
            f'{qual} "{name}" is invalid: {detail}',
            name=name,
            group=group,
            kind=kind,
            causes=causes,
        )


class TooManyRequests(APIError):
    code, reason = 429, "TooManyRequests"


class InternalError(APIError):
    code, reason = 500, "InternalError"


class ServiceUnavailable(APIError):
    code, reason = 503, "ServiceUnavailable"
