"""CustomResourceDefinition webhook conversion: the ConversionReview and what its answer means.

Pure functions (no I/O), the counterpart of kube's apiextensions-apiserver
pkg/apiserver/conversion/webhook_converter.go; the HTTPS call is
fleet/server/conversion_webhook.py.  One conversion, step by step:

1. `objects_to_convert`: only objects not already at the desired apiVersion go to the
   webhook (kube's `getObjectsToConvert`), and an object with nothing but apiVersion and
   kind is converted by setting its apiVersion (kube's `isEmptyUnstructuredObject`
   short-cut).  Nothing left: no call at all.
2. `review_version`: the first entry of `conversionReviewVersions` this server speaks
   (v1, v1beta1), in the CRD's order, as kube picks it; none: "no supported conversion
   review versions".
3. `build_review`: `{apiVersion: apiextensions.k8s.io/<v>, kind: ConversionReview,
   request: {uid, desiredAPIVersion, objects}}`.
4. `converted_objects`: the answer checked as `getConvertedObjectsFromResponse` checks it
   (for v1: apiVersion/kind, a response, the uid; for both: `result.status` Success, else
   the webhook's message).
5. `merge`: the count must match; each converted object must be at the desired
   group/version, keep its kind, name, namespace and uid; its metadata is then restored
   from the original except labels and annotations, which the webhook may change if they
   stay valid (`validateConvertedObject`, `restoreObjectMeta`).

Every failure is a `ConversionError` carrying kube's message, e.g. `conversion webhook for
stable.example.com/v1, Kind=CronTab failed: <why>`; kube answers the client's request with
it as a 500 Status without a reason (`ErrorToAPIStatus` of a plain error), so kubectl
prints `Error from server: conversion webhook for ...`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fleet.api import errors
from fleet.api.validation import Cause, validate_annotations, validate_labels

GROUP = "apiextensions.k8s.io"
KIND = "ConversionReview"
# The ConversionReview versions this server speaks, as kube-apiserver does.
SUPPORTED_REVIEW_VERSIONS = ("v1", "v1beta1")


class ConversionError(errors.APIError):
    """A conversion that failed: kube's message, answered as a 500 with no reason."""

    code, reason = 500, ""

    def status(self) -> dict[str, Any]:
        out = super().status()
        if not out.get("reason"):
            out.pop("reason", None)  # metav1.Status' reason is omitempty
        return out


# --------------------------------------------------------------------------- identities

def group_version(api_version: Any) -> str:
    """schema.GroupVersion's String() of an apiVersion as Unstructured reads it: "" when it
    is no string or does not parse (more than one '/')."""
    if not isinstance(api_version, str) or api_version.count("/") > 1:
        return ""
    group, _, version = api_version.rpartition("/")
    return f"{group}/{version}" if group else version


def gvk_string(api_version: Any, kind: Any) -> str:
    """schema.GroupVersionKind's String(): `group/version, Kind=kind` (`/v1, Kind=X` for the
    empty group, as Go prints it)."""
    gv = group_version(api_version)
    group, _, version = gv.rpartition("/")
    return f"{group}/{version}, Kind={kind if isinstance(kind, str) else ''}"


def _meta(obj: Any) -> dict[str, Any]:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return md if isinstance(md, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --------------------------------------------------------------------------- the request

def is_empty_object(obj: Any) -> bool:
    """Only apiVersion and kind: converted without the webhook (kube's smoke-test short-cut)."""
    return isinstance(obj, dict) and len(obj) == 2 and "apiVersion" in obj and "kind" in obj


def objects_to_convert(objects: list[dict[str, Any]], desired_api_version: str) -> list[int]:
    """Indexes of the objects the webhook must convert: those not at the desired apiVersion."""
    return [i for i, o in enumerate(objects)
            if o.get("apiVersion") != desired_api_version and not is_empty_object(o)]


def review_version(webhook: dict[str, Any] | None) -> str:
    """The ConversionReview version to send: the first of `conversionReviewVersions` this
    server supports, in the CRD's order."""
    versions = (webhook or {}).get("conversionReviewVersions")
    for v in versions if isinstance(versions, list) else []:
        if v in SUPPORTED_REVIEW_VERSIONS:
            return str(v)
    raise ConversionError("no supported conversion review versions")


def build_review(version: str, uid: str, desired_api_version: str,
                 objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConversionReview request kube-apiserver POSTs."""
    return {"apiVersion": f"{GROUP}/{version}", "kind": KIND,
            "request": {"uid": uid, "desiredAPIVersion": desired_api_version, "objects": objects}}


# --------------------------------------------------------------------------- the answer

def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _go_type(value: Any) -> str:
    """encoding/json's name for a JSON value's type, as its UnmarshalTypeError words it."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else "object"


def decode_review(body: bytes) -> dict[str, Any]:
    """The answer as a ConversionReview, or the decoder's complaint (raised as ValueError,
    which the caller words as a failed call)."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"couldn't get version/kind; json parse error: {e}") from None
    if not isinstance(review, dict):
        raise ValueError("couldn't get version/kind; json parse error: "
                         f"json: cannot unmarshal {_go_type(review)} into Go value of type struct "
                         '{ APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string '
                         '"json:\\"kind,omitempty\\"" }')
    if not review.get("kind") or not isinstance(review.get("kind"), str):
        raise ValueError(f"Object 'Kind' is missing in '{body.decode(errors='replace')}'")
    return review


def converted_objects(review: dict[str, Any], version: str, uid: str) -> list[Any]:
    """getConvertedObjectsFromResponse: the converted objects of a (decoded) answer; raises
    ValueError with kube's words for a malformed or unsuccessful one."""
    if version == "v1":
        want = f"{GROUP}/v1, Kind={KIND}"
        got = gvk_string(review.get("apiVersion"), review.get("kind"))
        if got != want:
            raise ValueError(f"expected webhook response of {want}, got {got}")
    resp = review.get("response")
    if not isinstance(resp, dict):
        raise ValueError("no response provided")
    # v1beta1 answers were never checked for their uid (kube skips it for compatibility).
    if version == "v1" and resp.get("uid") != uid:
        raise ValueError(f"expected response.uid={json.dumps(uid)}, got {json.dumps(_str(resp.get('uid')))}")
    result = resp.get("result") if isinstance(resp.get("result"), dict) else {}
    if result.get("status") != "Success":
        message = result.get("message")
        if isinstance(message, str) and message:
            raise ValueError(message)
        raise ValueError(f"response.result.status was '{_str(result.get('status'))}', not 'Success'")
    objs = resp.get("convertedObjects")
    if objs is None:
        return []
    if not isinstance(objs, list):
        raise ValueError(f"json: cannot unmarshal {_go_type(objs)} into Go struct field "
                         "ConversionResponse.response.convertedObjects of type []runtime.RawExtension")
    return objs


def _field_errors(causes: list[Cause]) -> str:
    """field.ErrorList.ToAggregate().Error(): one error as it is, more in brackets."""
    msgs = []
    for c in causes:
        m = f"{c['field']}: {c['message']}"
        if m not in msgs:
            msgs.append(m)
    return msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"


def validate_converted(original: dict[str, Any], converted: dict[str, Any]) -> None:
    """validateConvertedObject: same kind, name, namespace and uid (ValueError otherwise)."""
    before, after = _meta(original), _meta(converted)
    for what, a, b in (("kind", original.get("kind"), converted.get("kind")),
                       ("name", before.get("name"), after.get("name")),
                       ("namespace", before.get("namespace"), after.get("namespace")),
                       ("UID", before.get("uid"), after.get("uid"))):
        if _str(a) != _str(b):
            raise ValueError(f"must have the same {what}: {_str(a)} != {_str(b)}")


def restore_object_meta(original: dict[str, Any], converted: dict[str, Any]) -> dict[str, Any]:
    """restoreObjectMeta: the converted object with the original's metadata, except the
    webhook's labels and annotations (validated when they changed); ValueError otherwise."""
    if "metadata" not in converted:
        raise ValueError("missing metadata in converted object")
    response = converted["metadata"]
    if not isinstance(response, dict):
        raise ValueError(f"invalid metadata of type {_go_map_type(response)} in converted object")
    restored = copy.deepcopy(original.get("metadata")) if "metadata" in original else {}
    if not isinstance(restored, dict):
        raise ValueError(f"invalid metadata of type {_go_map_type(restored)} in input object")
    for fld in ("labels", "annotations"):
        value = response.get(fld)
        if value is None:
            restored.pop(fld, None)
            continue
        if not isinstance(value, dict):
            raise ValueError(f"invalid metadata.{fld} of type {_go_map_type(value)} in converted object")
        before = restored.get(fld)
        if before is not None and not isinstance(before, dict):
            raise ValueError(f"invalid metadata.{fld} of type {_go_map_type(before)} in original object")
        before = before or {}
        changed = len(before) != len(value)
        for k, v in value.items():
            if not isinstance(v, str):
                raise ValueError(f"metadata.{fld}[{k}] must be a string, but is {_go_map_type(v)} "
                                 "in converted object")
            if before.get(k) != v:
                changed = True
        if changed:
            causes = (validate_labels(value, "metadata.labels") if fld == "labels"
                      else validate_annotations(value, "metadata.annotation"))  # kube's path, sic
            if causes:
                raise ValueError(_field_errors(causes))
        restored[fld] = value
    out = dict(converted)
    out["metadata"] = restored
    return out


def _go_map_type(value: Any) -> str:
    """Go's %T of a decoded JSON value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "float64" if not isinstance(value, int) else "int64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "[]interface {}"
    if value is None:
        return "<nil>"
    return "map[string]interface {}"


def _as_object(item: Any) -> dict[str, Any]:
    """getRawExtensionObject: a converted item decoded as an Unstructured object."""
    if not isinstance(item, dict):
        raise ValueError(f"json: cannot unmarshal {_go_type(item)} into Go value of type map[string]interface {{}}")
    if not isinstance(item.get("kind"), str) or not item.get("kind"):
        raise ValueError(f"Object 'Kind' is missing in '{_compact(item)}'")
    return item


def source_gvk(objects: list[dict[str, Any]], indexes: list[int]) -> str:
    """What kube's messages name: the GVK of what was converted (the object; for a list,
    the list kind `<Kind>List` at the objects' version)."""
    first = objects[indexes[0]] if indexes else (objects[0] if objects else {})
    kind = _str(first.get("kind"))
    if len(objects) != 1:
        kind += "List"
    return gvk_string(first.get("apiVersion"), kind)


def failed(gvk: str, why: str) -> ConversionError:
    """The call or its answer failed."""
    return ConversionError(f"conversion webhook for {gvk} failed: {why}")


def merge(objects: list[dict[str, Any]], indexes: list[int], converted: list[Any],
          desired_api_version: str) -> list[dict[str, Any]]:
    """The objects with the converted ones in place, checked and with their metadata restored.
    One object is worded as kube words a single object, more as it words a list."""
    gvk = source_gvk(objects, indexes)
    if len(converted) != len(indexes):
        raise ConversionError(f"conversion webhook for {gvk} returned {len(converted)} objects, "
                              f"expected {len(indexes)}")
    out = list(objects)
    desired_gv = group_version(desired_api_version)
    single = len(objects) == 1
    for n, (i, item) in enumerate(zip(indexes, converted, strict=True)):
        original = objects[i]
        if single:
            where, meta_where = "returned invalid object at index 0", "returned invalid metadata"
        else:
            # kube's list path counts the index up before its later messages (so they name n+1).
            where = f"returned invalid converted object at index {n}"
            meta_where = f"returned invalid metadata in object at index {n}"
        try:
            obj = _as_object(item)
        except ValueError as e:
            if single:
                raise ConversionError(str(e)) from None
            raise ConversionError(f"conversion webhook for {gvk} {where}: {e}") from None
        if not single:
            where = f"returned invalid converted object at index {n + 1}"
            meta_where = f"returned invalid metadata in object at index {n + 1}"
        got_gv = group_version(obj.get("apiVersion"))
        if got_gv != desired_gv:
            raise ConversionError(f"conversion webhook for {gvk} {where}: invalid groupVersion "
                                  f"(expected {desired_gv}, received {got_gv})")
        if _str(obj.get("kind")) != _str(original.get("kind")):
            raise ConversionError(f"conversion webhook for {gvk} {where}: invalid kind "
                                  f"(expected {_str(original.get('kind'))}, received {_str(obj.get('kind'))})")
        try:
            validate_converted(original, obj)
        except ValueError as e:
            what = "returned invalid object" if single else where
            raise ConversionError(f"conversion webhook for {gvk} {what}: {e}") from None
        try:
            out[i] = restore_object_meta(original, obj)
        except ValueError as e:
            raise ConversionError(f"conversion webhook for {gvk} {meta_where}: {e}") from None
    return out


def nop_converted(objects: list[dict[str, Any]], desired_api_version: str) -> list[dict[str, Any]]:
    """The objects the webhook is not asked about: empty ones get the desired apiVersion."""
    return [{**o, "apiVersion": desired_api_version} if is_empty_object(o) else o for o in objects]


def answer(objects: list[dict[str, Any]], indexes: list[int], desired_api_version: str,
           version: str, uid: str, body: bytes) -> list[dict[str, Any]]:
    """The whole check of a webhook's answer `body` to the review (`version`, `uid`) about
    `objects[i] for i in indexes`: the converted list, or a ConversionError."""
    gvk = source_gvk(objects, indexes)
    try:
        converted = converted_objects(decode_review(body), version, uid)
    except ValueError as e:
        raise failed(gvk, str(e)) from None
    return merge(nop_converted(objects, desired_api_version), indexes, converted, desired_api_version)
