"""Typed checking of whole objects against the Kubernetes type schemas.

kube-apiserver decodes every body into Go structs, so a field of the wrong
JSON type (`"status": 5`, `"replicas": "abc"`, an int32 of 2^31) never gets
past decoding, and nothing downstream ever sees it.  Fleet keeps objects as
JSON dicts, so this module is that decoding step: one generic walk over the
schema in `k8s_schema.json` (see `fleet.api.schema`) that

- refuses a value whose JSON type is not the field's (object, array, string,
  integer in its Go range, boolean, number, quantity, int-or-string,
  date-time, base64 bytes), with one cause per field path;
- drops `null` where Go would (an absent pointer, slice or map round-trips as
  absent), so code reading `obj["spec"]` never meets `None` for an object;
- prunes fields the schema does not know (Go's decoder drops them too) and
  reports their paths, for `fieldValidation` to warn about or refuse.

Kinds without a schema (CRDs, metrics) still get their `metadata` checked
against `ObjectMeta`, which every role relies on.  The checker is pure and
bounded: it visits each value once and carries no recursion deeper than the
decoder already allowed (see `fleet.api.decode`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from fleet.api import schema
from fleet.api.errors import cause
from fleet.api.quantity import QUANTITY_ERROR, QuantityError, parse_quantity

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

# Integer fields whose Go type is int64; every other `integer` field is int32
# (replicas, ports, counts, probe periods...).  The schema generated from the
# Python client does not carry the OpenAPI `format`, so the int64 ones are
# named here (from k8s.io/api's Go types).
INT64_FIELDS = frozenset({
    "activeDeadlineSeconds", "capacity", "deletionGracePeriodSeconds", "expirationSeconds",
    "fsGroup", "generation", "observedGeneration", "gracePeriodSeconds", "runAsGroup", "runAsUser",
    "revision", "sizeBytes", "startingDeadlineSeconds", "terminationGracePeriodSeconds",
    "tolerationSeconds", "uid", "gid", "supplementalGroups", "seconds", "user", "start",
})

# resource.Quantity fields (the Python client types them as plain strings).
QUANTITY_FIELDS = frozenset({
    ("V1ContainerStatus", "allocatedResources"), ("V1EmptyDirVolumeSource", "sizeLimit"),
    ("V1LimitRangeItem", "default"), ("V1LimitRangeItem", "defaultRequest"), ("V1LimitRangeItem", "max"),
    ("V1LimitRangeItem", "maxLimitRequestRatio"), ("V1LimitRangeItem", "min"),
    ("V1NodeAllocatableMappedResources", "quantity"),
    ("V1NodeStatus", "allocatable"), ("V1NodeStatus", "capacity"),
    ("V1PersistentVolumeClaimStatus", "allocatedResources"), ("V1PersistentVolumeClaimStatus", "capacity"),
    ("V1PersistentVolumeSpec", "capacity"), ("V1CSIStorageCapacity", "capacity"),
    ("V1CSIStorageCapacity", "maximumVolumeSize"),
    ("V1PodSpec", "overhead"), ("V1PodStatus", "allocatedResources"), ("V1ResourceFieldSelector", "divisor"),
    ("V1ResourceQuotaSpec", "hard"), ("V1ResourceQuotaStatus", "hard"), ("V1ResourceQuotaStatus", "used"),
    ("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
    ("V1VolumeResourceRequirements", "limits"), ("V1VolumeResourceRequirements", "requests"),
    ("V2MetricTarget", "averageValue"), ("V2MetricTarget", "value"), ("V2MetricValueStatus", "averageValue"),
    ("V2MetricValueStatus", "value"), ("V2HPAScalingRules", "tolerance"),
})

# intstr.IntOrString fields (the client types them as `object`).
INT_OR_STRING_FIELDS = frozenset({
    ("V1HTTPGetAction", "port"), ("V1TCPSocketAction", "port"), ("V1ServicePort", "targetPort"),
    ("V1PodDisruptionBudgetSpec", "maxUnavailable"), ("V1PodDisruptionBudgetSpec", "minAvailable"),
    ("V1RollingUpdateDaemonSet", "maxSurge"), ("V1RollingUpdateDaemonSet", "maxUnavailable"),
    ("V1RollingUpdateDeployment", "maxSurge"), ("V1RollingUpdateDeployment", "maxUnavailable"),
    ("V1RollingUpdateStatefulSetStrategy", "maxUnavailable"),
})

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")
_MAX_CAUSES = 50


@dataclass
class TypeReport:
    """What `check` found: type errors (one cause per field) and pruned unknown fields."""

    causes: list[dict[str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def type_name_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _shown(value: Any) -> str:
    # Scalars are shown as Go's %#v would; containers by their type only, so a
    # hostile multi-megabyte value never ends up in an error message.
    if isinstance(value, dict | list):
        return json.dumps(type_name_of(value))
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 64 else value[:64] + "...", ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if not isinstance(value, int) or abs(value) < 10**30 else f"{str(value)[:30]}..."


def type_invalid(path: str, value: Any, expected: str) -> dict[str, str]:
    return cause(path, f"Invalid value: {_shown(value)}: must be of type {expected}", "FieldValueTypeInvalid")


def out_of_range(path: str, value: Any, bounds: tuple[int, int]) -> dict[str, str]:
    return cause(path, f"Invalid value: {_shown(value)}: must be between {bounds[0]} and {bounds[1]}, "
                 "inclusive", "FieldValueInvalid")


def check(type_name: str | None, obj: dict[str, Any], *, prune: bool = True) -> TypeReport:
    """Check (and normalize in place) a whole object of schema type `type_name`.

    `None` means the kind has no schema: only `metadata` is checked.  Top-level
    `apiVersion`/`kind` are the caller's to have checked already.
    """
    report = TypeReport()
    if type_name is None:
        md = obj.get("metadata")
        if md is not None:
            _walk({"ref": "V1ObjectMeta"}, md, "metadata", "", "metadata", report, prune)
        return report
    _walk_ref(type_name, obj, "", report, prune)
    return report


def _walk_ref(type_name: str, value: dict[str, Any], path: str, report: TypeReport, prune: bool) -> None:
    fields = schema.types().get(type_name, {}).get("fields", {})
    for key in list(value):
        sub = value[key]
        f = fields.get(key)
        child = f"{path}.{key}" if path else key
        if f is None:
            report.unknown.append("." + child)
            if prune:
                del value[key]
            continue
        expr = f["type"]
        if sub is None:
            # Go decodes null into a nil pointer/slice/map, which encodes as absent.
            if not isinstance(expr, str):
                del value[key]
            continue
        _walk(expr, sub, child, type_name, key, report, prune)


def _walk(expr: Any, value: Any, path: str, owner: str, fname: str, report: TypeReport, prune: bool) -> None:
    if len(report.causes) >= _MAX_CAUSES or value is None:
        return
    if isinstance(expr, str):
        c = _scalar(expr, value, path, owner, fname)
        if c is not None:
            report.causes.append(c)
        return
    if "ref" in expr:
        if not isinstance(value, dict):
            report.causes.append(type_invalid(path, value, "object"))
            return
        _walk_ref(expr["ref"], value, path, report, prune)
    elif "list" in expr:
        if not isinstance(value, list):
            report.causes.append(type_invalid(path, value, "array"))
            return
        item = expr["list"]
        for i, v in enumerate(value):
            p = f"{path}[{i}]"
            if v is None:
                # A null item has no Go zero value that means anything here.
                report.causes.append(type_invalid(p, v, _expected(item)))
                continue
            _walk(item, v, p, owner, fname, report, prune)
    else:
        if not isinstance(value, dict):
            report.causes.append(type_invalid(path, value, "object"))
            return
        item = expr["map"]
        for k in list(value):
            v = value[k]
            p = f"{path}[{k}]"
            if v is None:
                if isinstance(item, str):
                    # A null string in a map[string]string decodes to "".
                    value[k] = ""
                    continue
                del value[k]
                continue
            _walk(item, v, p, owner, fname, report, prune)


def _expected(expr: Any) -> str:
    if isinstance(expr, str):
        return {"integer": "integer", "boolean": "boolean", "number": "number"}.get(expr, "string")
    if "list" in expr:
        return "array"
    return "object"


def _scalar(kind: str, value: Any, path: str, owner: str, fname: str) -> dict[str, str] | None:
    if (owner, fname) in QUANTITY_FIELDS:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return type_invalid(path, value, "string")
        if isinstance(value, float) and not math.isfinite(value):
            return cause(path, f"Invalid value: {_shown(value)}: {QUANTITY_ERROR}", "FieldValueInvalid")
        try:
            parse_quantity(value)
        except QuantityError:
            return cause(path, f"Invalid value: {_shown(value)}: {QUANTITY_ERROR}", "FieldValueInvalid")
        return None
    if kind == "any":
        if (owner, fname) in INT_OR_STRING_FIELDS:
            if isinstance(value, str):
                return None
            if isinstance(value, int) and not isinstance(value, bool):
                return None if INT32[0] <= value <= INT32[1] else out_of_range(path, value, INT32)
            return type_invalid(path, value, "integer or string")
        return None
    if kind == "string":
        return None if isinstance(value, str) else type_invalid(path, value, "string")
    if kind == "boolean":
        return None if isinstance(value, bool) else type_invalid(path, value, "boolean")
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return type_invalid(path, value, "integer")
        bounds = INT64 if fname in INT64_FIELDS else INT32
        return None if bounds[0] <= value <= bounds[1] else out_of_range(path, value, bounds)
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return type_invalid(path, value, "number")
        if isinstance(value, float) and not math.isfinite(value):
            return cause(path, f"Invalid value: {_shown(value)}: must be a finite number", "FieldValueInvalid")
        return None
    if kind in ("date-time", "date"):
        if not isinstance(value, str):
            return type_invalid(path, value, "string")
        if value and kind == "date-time" and not _RFC3339.fullmatch(value):
            return cause(path, f'Invalid value: {_shown(value)}: must be a date-time in RFC 3339 format '
                         '(e.g. "2006-01-02T15:04:05Z")', "FieldValueInvalid")
        return None
    if kind == "byte":
        if not isinstance(value, str):
            return type_invalid(path, value, "string")
        try:
            base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            return cause(path, f"Invalid value: {_shown(value)}: illegal base64 data", "FieldValueInvalid")
        return None
    return None


# ownerReferences: what ValidateOwnerReferences asks beyond the types.
def owner_reference_causes(refs: Any, path: str = "metadata.ownerReferences") -> list[dict[str, str]]:
    if not isinstance(refs, list):
        return []
    out: list[dict[str, str]] = []
    controllers = 0
    for i, ref in enumerate(refs):
        p = f"{path}[{i}]"
        if not isinstance(ref, dict):
            continue
        for fname, what in (("apiVersion", "version"), ("kind", "kind"), ("name", "name"), ("uid", "uid")):
            if not ref.get(fname):
                out.append(cause(f"{p}.{fname}", f'Invalid value: "": {what} must not be empty',
                                 "FieldValueInvalid"))
        if ref.get("controller") is True:
            controllers += 1
    if controllers > 1:
        out.append(cause(path, "Invalid value: \"object\": Only one reference can have Controller set to "
                         "true", "FieldValueInvalid"))
    return out


def managed_fields_causes(entries: Any, path: str = "metadata.managedFields") -> list[dict[str, str]]:
    if not isinstance(entries, list):
        return []
    out: list[dict[str, str]] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            continue
        op = e.get("operation")
        if op not in ("Apply", "Update"):
            out.append(cause(f"{path}[{i}].operation", f"Unsupported value: {_shown(op)}: supported "
                             'values: "Apply", "Update"', "FieldValueNotSupported"))
        if e.get("fieldsType") not in (None, "FieldsV1"):
            out.append(cause(f"{path}[{i}].fieldsType", f"Unsupported value: {_shown(e.get('fieldsType'))}: "
                             'supported values: "FieldsV1"', "FieldValueNotSupported"))
    return out


__all__ = ["TypeReport", "check", "owner_reference_causes", "managed_fields_causes", "INT32", "INT64"]
