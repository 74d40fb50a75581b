"""What a request carries besides its route, read and checked as kube-apiserver
does: the body decoded (JSON, YAML, protobuf; bounded by MAX_BODY), the
query parameters (dryRun, limit, fieldManager, resourceVersion), continue
tokens of paged lists, DeleteOptions, generateName suffixes and the Warning
headers of a response.  Pure functions of a `Req`: no store, no registry.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from fleet.api import decode, errors, protobuf
from fleet.server.http import JSON, Req

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's request body limit


JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
def decode_body(req: Req, *, allow_patch: bool = False) -> Any:
    return decode_request(req, allow_patch=allow_patch).value


def decode_request(req: Req, *, allow_patch: bool = False) -> decode.Decoded:
    """The body as plain, bounded JSON data (see fleet/api/decode.py), or a 400/413/415."""
    if len(req.body) > MAX_BODY:
        raise errors.RequestEntityTooLarge("the request body is too large (limit 3145728 bytes)")
    ctype = req.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if not req.body.strip():
        raise errors.BadRequest("the request body is empty")
    try:
        if ctype == protobuf.MEDIA_TYPE:
            # kubectl create/expose/run (client-go typed clients) send protobuf; see fleet/api/protobuf.py.
            try:
                value = protobuf.decode_body(req.body)
            except errors.APIError:
                raise
            except Exception as e:  # a hostile message must be a 400, whatever the decoder tripped on
                raise errors.BadRequest(f"the protobuf body could not be decoded: {type(e).__name__}") from None
            decode.check_value(value, max_bytes=MAX_BODY)
            return decode.Decoded(value)
        if ctype in ("application/json", "") or (allow_patch and ctype in (JSON_PATCH, MERGE_PATCH,
                                                                           STRATEGIC_PATCH)):
            return decode.decode_json(req.body, max_bytes=MAX_BODY)
        if ctype in ("application/yaml", "application/x-yaml", "text/yaml"):
            return decode.decode_yaml(req.body, max_bytes=MAX_BODY)
    except decode.TooLarge as e:
        raise errors.RequestEntityTooLarge(str(e)) from None
    except decode.DecodeError as e:
        raise errors.BadRequest(f"the request body could not be decoded: {e}") from None
    raise errors.UnsupportedMediaType(
        f'the body of the request was in an unknown format - accepted media types include: '
        f'application/json, application/yaml (got "{ctype}")')


def encode_continue(revision: int, key: str) -> str:
    raw = json.dumps({"v": "fleet/1", "rv": revision, "start": key}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str, prefix: str | None = None) -> tuple[int, str]:
    """(revision, start key) of a token made by `encode_continue`.

    Anything else is 400 BadRequest "continue key is not valid: ...", as from
    kube-apiserver's DecodeContinue: not base64 or JSON, another encoding (a
    real Kubernetes token), a revision that is not a positive int64 (SQLite
    binds no more; a forged one was a 500), an empty start key, or, given
    `prefix`, a start key outside the list being continued (a token of another
    namespace or kind must not page through this one).
    """
    def invalid(why: str) -> errors.BadRequest:
        return errors.BadRequest(f"continue key is not valid: {why}")

    try:
        pad = "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(token + pad))
    except (ValueError, TypeError, RecursionError) as e:  # RecursionError: deeply nested JSON
        raise invalid(str(e) or type(e).__name__) from None
    if not isinstance(data, dict):
        raise invalid("not an encoded continue token")
    if data.get("v") != "fleet/1":
        raise invalid(f"server does not recognize this encoded version {json.dumps(data.get('v'))}")
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or not 0 < rv <= _MAX_INT64:
        raise invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise invalid("encoded start key empty")
    if prefix is not None and (not start.startswith(prefix) or start == prefix):
        raise invalid(f"start key {json.dumps(start)} is not in the requested list")
    return rv, start


def random_suffix(n: int = 5) -> str:
    # kube-apiserver's alphabet for generateName (no vowels, no confusable digits)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


def parse_rv(value: Any, what: str = "resourceVersion") -> int | None:
    """A resourceVersion as the storage layer reads it: decimal digits of a uint64
    (Go's ParseUint; Python's int() would also take " 5", "+5" and "1_0")."""
    if value in (None, ""):
        return None
    text = value if isinstance(value, str) else None
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 20 or int(text) > 2**64 - 1:
        shown = value if isinstance(value, str) and len(value) <= 64 else type(value).__name__
        raise errors.BadRequest(f'invalid {what}: "{shown}" is not a valid resource version')
    return int(text)

def is_dry_run(req: Req) -> bool:
    v = req.query.get("dryRun", "")
    if v and v != "All":
        raise errors.BadRequest(f'dryRun: Unsupported value: "{v}": supported values: "All"')
    return v == "All"


_MAX_INT64 = 2**63 - 1  # the query integers are Go int64s; SQLite binds no larger either


def _int_param(req: Req, name: str, default: int) -> int:
    v = req.query.get(name)
    if v in (None, ""):
        return default
    # What Go's strconv.ParseInt(v, 10, 64) accepts; Python's int() also takes
    # spaces, "1_000" and non-ASCII digits, and any size (limit=2**63 was a 500).
    digits = v[1:] if v[:1] in ("+", "-") else v
    if not (digits.isascii() and digits.isdigit()):
        raise errors.BadRequest(f'{name}: invalid value "{v}": must be an integer')
    # Length first: int() itself refuses more than 4300 digits (a ValueError, so a 500).
    if len(digits) > 19 or int(v) > _MAX_INT64:
        raise errors.BadRequest(f'{name}: invalid value "{v}": value out of range')
    n = int(v)
    if n < 0:
        raise errors.BadRequest(f"{name}: must be non-negative")
    return n


def check_field_manager(req: Req) -> None:
    """ValidateFieldManager: at most 128 bytes of printable characters (422 otherwise)."""
    fm = req.query.get("fieldManager")
    if fm is None:
        return
    opts = {"POST": "CreateOptions", "PUT": "UpdateOptions"}.get(req.method, "PatchOptions")
    if len(fm.encode()) > 128:
        raise errors.Invalid.for_object(opts, "meta.k8s.io", "", [errors.cause(
            "fieldManager", "Too long: may not be more than 128 bytes", "FieldValueTooLong")])
    if not fm.isprintable():
        raise errors.Invalid.for_object(opts, "meta.k8s.io", "", [errors.cause(
            "fieldManager", f"Invalid value: {json.dumps(fm)}: may only contain printable characters")])


def warning_headers(warnings: list[str]) -> dict[str, str]:
    if not warnings:
        return {}
    # One Warning header per message; joined with ", " (HTTP allows folding repeated headers).
    return {"Warning": ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in warnings)}


def add_warning_headers(headers: dict[str, str], warnings: list[str]) -> None:
    """Append `warnings` (admission's) to a response's headers, after any already there."""
    extra = warning_headers(warnings)
    if not extra:
        return
    headers["Warning"] = f"{headers['Warning']}, {extra['Warning']}" if headers.get("Warning") else extra["Warning"]


def delete_options(req: Req) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if req.body.strip():
        body = decode_body(req)
        if not isinstance(body, dict):
            raise errors.BadRequest("DeleteOptions must be an object")
        opts = body
    if "gracePeriodSeconds" in req.query:
        opts["gracePeriodSeconds"] = _int_param(req, "gracePeriodSeconds", 0)
    if "propagationPolicy" in req.query:
        opts["propagationPolicy"] = req.query["propagationPolicy"]
    if "orphanDependents" in req.query:
        # The legacy option, as query parameter too (client-go encodes DeleteOptions both ways).
        opts["orphanDependents"] = {"true": True, "false": False}.get(req.query["orphanDependents"],
                                                                     req.query["orphanDependents"])
    if "dryRun" in req.query:
        opts["dryRun"] = [req.query["dryRun"]]
    opts = check_delete_options(opts, invalid_status=True)
    if opts.get("dryRun") == ["All"]:
        req.query.setdefault("dryRun", "All")
    return opts


def check_delete_options(opts: dict[str, Any], *, invalid_status: bool = False) -> dict[str, Any]:
    """Refuse DeleteOptions values kube-apiserver refuses; returns `opts`.

    Malformed values are 400.  With `invalid_status` (a DELETE request) an
    unsupported propagationPolicy, or one given together with the legacy
    orphanDependents, is 422 Invalid on `DeleteOptions.meta.k8s.io` as
    kube-apiserver's ValidateDeleteOptions answers."""
    grace = opts.get("gracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool)):
        raise errors.BadRequest(f"gracePeriodSeconds: Invalid value: {json.dumps(grace)}: must be an integer")
    orphan = opts.get("orphanDependents")
    if orphan is not None and not isinstance(orphan, bool):
        raise errors.BadRequest(f"orphanDependents: Invalid value: {json.dumps(orphan)}: must be a boolean")
    pp = opts.get("propagationPolicy")
    if pp not in (None, "Background", "Foreground", "Orphan"):
        if invalid_status:
            raise errors.Invalid.for_object("DeleteOptions", "meta.k8s.io", "", [errors.cause(
                "propagationPolicy", f'Unsupported value: "{pp}": supported values: "Foreground", '
                '"Background", "Orphan", "nil"', "FieldValueNotSupported")])
        raise errors.BadRequest(f'propagationPolicy: Unsupported value: "{pp}": supported values: '
                                f'"Background", "Foreground", "Orphan"')
    if pp is not None and orphan is not None:
        raise errors.Invalid.for_object("DeleteOptions", "meta.k8s.io", "", [errors.cause(
            "propagationPolicy", f'Invalid value: "{pp}": orphanDependents and deletionPropagation '
            "cannot be both set", "FieldValueInvalid")])
    pre = opts.get("preconditions")
    if pre is not None and not isinstance(pre, dict):
        raise errors.BadRequest("preconditions must be an object")
    dry = opts.get("dryRun")
    if dry and dry != ["All"]:
        raise errors.BadRequest(f"dryRun: Unsupported value: {dry}")
    return opts
