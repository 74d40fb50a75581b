"""Kubernetes protobuf request bodies, decoded into the JSON-shaped dicts the API server handles.

kubectl's imperative commands (`create configmap|secret|deployment|namespace|job|cronjob|
serviceaccount|service`, `expose`, `run`, the evictions of `drain`) go through client-go's typed
clients, which POST `Content-Type: application/vnd.kubernetes.protobuf` and never fall back to
JSON.  Fleet stores and handles JSON only, so this module owns the other direction: it turns such a
body back into exactly the dict the Kubernetes JSON encoding of the same object would give, and the
rest of the server never knows the request was protobuf.  Decoding only: the server answers JSON,
which those clients accept.

The body is the 4-byte magic ``k8s\\x00`` followed by a `runtime.Unknown` (typeMeta{apiVersion=1,
kind=2}=1, raw=2, contentEncoding=3, contentType=4); `raw` is the object in the proto2 wire format
of k8s.io/api's ``generated.proto``.  The wire decoder here is self-contained (varints,
length-delimited, fixed32/64; packed and unpacked repeated scalars; maps as repeated key=1/value=2
entries).

`SCHEMA` maps a message to ``{field number: (json name, kind, message or None, flags)}``.  It is the
closure of every kind Fleet serves (plus `policy/v1 Eviction` and `DeleteOptions`), taken from the
file descriptors compiled into kubectl 1.32 (k8s.io/api and apimachinery ``generated.proto``) and
checked against kubernetes/api ``core/v1/generated.proto``; the proto field names are the JSON tags.
Unknown field numbers are skipped (the wire type says how long they are), so a newer client only
loses fields Fleet's schema does not know anyway.

How the result matches the JSON encoding:

* go-to-protobuf marshals every non-pointer scalar, even when it is zero, so a zero string, number
  or bool on the wire is "unset" and omitted (what ``omitempty`` does in JSON); fields that are Go
  pointers (flag `PTR`, from gogoproto ``nullable``) keep their zero, so ``replicas: 0`` survives.
* A present message is a dict even when empty (``strategy: {}``, ``emptyDir: {}``), as in JSON.
  Embedded structs JSON inlines (flag `INLINE`: `Volume.volumeSource`, `Probe.handler`,
  `*KeySelector.localObjectReference`, ...) merge into their parent, as in JSON.
* `Time` and `MicroTime` become RFC 3339 strings; the zero time is sent as an empty message (kubectl
  does this for ``creationTimestamp``) and is omitted, where JSON would say null.
* `IntOrString` becomes an int or a str, `Quantity` its string, `bytes` base64 (``Secret.data``),
  maps dicts, `FieldsV1` the JSON it carries.

Malformed bytes raise `BadRequest`; an (apiVersion, kind) outside `KINDS` or an encoded
(``contentEncoding``) payload raises `UnsupportedMediaType`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from fleet.api import errors

MEDIA_TYPE: Final = "application/vnd.kubernetes.protobuf"
MAGIC: Final = b"k8s\x00"

# Field kinds.  MSG names a message of SCHEMA; the others are scalars or apimachinery types with a
# JSON form of their own.
STR: Final = "string"
INT: Final = "int"  # int32/int64 varints (two's complement, so negative int32 take 10 bytes)
BOOL: Final = "bool"
BYTES: Final = "bytes"  # base64 in JSON
MSG: Final = "message"
INTSTR: Final = "intstr.IntOrString"  # type=1 (0 int, 1 string), intVal=2, strVal=3
QUANTITY: Final = "resource.Quantity"  # string=1
TIME: Final = "meta.v1.Time"  # seconds=1, nanos=2; RFC 3339, seconds precision
MICROTIME: Final = "meta.v1.MicroTime"  # seconds=1, nanos=2; RFC 3339 with microseconds
FIELDS: Final = "meta.v1.FieldsV1"  # Raw=1: JSON bytes
# A message whose only field, repeated string items=1, is its whole JSON form: a list
# (authorization/authentication `ExtraValue`, a Go `[]string` type with a proto wrapper).
STRINGS: Final = "ExtraValue"

# Field flags.
REP: Final = 1  # repeated
PTR: Final = 2  # a Go pointer: a zero scalar on the wire was set on purpose and is kept
MAP: Final = 4  # map<string, kind>: repeated entries {1: key, 2: value}
INLINE: Final = 8  # an embedded Go struct tagged `json:",inline"`: its fields merge into the parent

Field = tuple[str, str, "str | None", int]
Message = dict[int, Field]

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_BYTES, _WIRE_FIXED32 = 0, 1, 2, 5
_U64: Final = 1 << 64
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def decode_body(raw: bytes) -> dict[str, Any]:
    """Decode a `application/vnd.kubernetes.protobuf` request body into its JSON-shaped dict."""
    if not raw.startswith(MAGIC):
        raise errors.BadRequest(
            "the protobuf body does not start with the Kubernetes magic number 'k8s\\x00'")
    api_version, kind, payload, encoding = _unknown(raw[len(MAGIC):])
    if encoding:
        raise errors.UnsupportedMediaType(
            f'protobuf bodies with contentEncoding "{encoding}" are not supported')
    message = KINDS.get((api_version, kind))
    if message is None:
        raise errors.UnsupportedMediaType(
            f'{kind or "<no kind>"} in {api_version or "<no apiVersion>"} is not supported as '
            f"{MEDIA_TYPE}; send it as application/json")
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind}
    obj.update(_message(payload, message, kind))
    return obj


def _unknown(buf: bytes) -> tuple[str, str, bytes, str]:
    """runtime.Unknown → (apiVersion, kind, raw, contentEncoding)."""
    api_version = kind = encoding = ""
    payload = b""
    for num, wire, val in _fields(buf, "runtime.Unknown"):
        if num == 1:
            for tnum, twire, tval in _fields(_bytes(wire, val, "typeMeta"), "typeMeta"):
                if tnum == 1:
                    api_version = _str(twire, tval, "typeMeta.apiVersion")
                elif tnum == 2:
                    kind = _str(twire, tval, "typeMeta.kind")
        elif num == 2:
            payload = _bytes(wire, val, "raw")
        elif num == 3:
            encoding = _str(wire, val, "contentEncoding")
    return api_version, kind, payload, encoding


# -- wire format ------------------------------------------------------------------------------

def _malformed(where: str, what: str) -> errors.BadRequest:
    return errors.BadRequest(f"malformed protobuf body at {where}: {what}")


def _varint(buf: bytes, pos: int, where: str) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise _malformed(where, "truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >= _U64:
                raise _malformed(where, "varint overflows 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise _malformed(where, "varint longer than 10 bytes")


def _fields(buf: bytes, where: str) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field number, wire type, value) for each field of one message."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos, where)
        num, wire = key >> 3, key & 7
        if num == 0:
            raise _malformed(where, "field number 0")
        val: int | bytes
        if wire == _WIRE_VARINT:
            val, pos = _varint(buf, pos, where)
        elif wire == _WIRE_BYTES:
            size, pos = _varint(buf, pos, where)
            if pos + size > end:
                raise _malformed(where, f"field {num} runs past the end of its message")
            val = buf[pos:pos + size]
            pos += size
        elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
            width = 8 if wire == _WIRE_FIXED64 else 4
            if pos + width > end:
                raise _malformed(where, f"truncated fixed{width * 8} field {num}")
            val = int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        else:  # 3/4 are proto groups, which Kubernetes never uses; 6/7 do not exist
            raise _malformed(where, f"unsupported wire type {wire} for field {num}")
        yield num, wire, val


def _bytes(wire: int, val: int | bytes, where: str) -> bytes:
    if wire != _WIRE_BYTES or not isinstance(val, bytes):
        raise _malformed(where, f"wire type {wire} where a length-delimited field was expected")
    return val


def _int(wire: int, val: int | bytes, where: str) -> int:
    if wire != _WIRE_VARINT or not isinstance(val, int):
        raise _malformed(where, f"wire type {wire} where a varint was expected")
    return val - _U64 if val >= 1 << 63 else val


def _str(wire: int, val: int | bytes, where: str) -> str:
    # Go strings may hold any bytes; its JSON encoder replaces invalid UTF-8 the same way.
    return _bytes(wire, val, where).decode("utf-8", "replace")


# -- schema-driven decoding -------------------------------------------------------------------

def _message(buf: bytes, name: str, where: str) -> dict[str, Any]:
    table = SCHEMA[name]
    out: dict[str, Any] = {}
    for num, wire, val in _fields(buf, where):
        spec = table.get(num)
        if spec is None:
            continue  # a field this schema does not know: skipped, its wire type gave its length
        json_name, kind, msg, flags = spec
        at = f"{where}.{json_name}"
        if flags & MAP:
            key, value = _map_entry(_bytes(wire, val, at), kind, msg, at)
            out.setdefault(json_name, {})[key] = value
        elif flags & REP:
            items = out.setdefault(json_name, [])
            if wire == _WIRE_BYTES and kind in (INT, BOOL):  # packed repeated scalars
                items.extend(_packed(val, kind, at))
            else:
                items.append(_value(kind, msg, wire, val, at))
        elif flags & INLINE:
            out.update(_value(kind, msg, wire, val, at))
        else:
            value = _value(kind, msg, wire, val, at)
            if value is None or (not value and kind in (STR, INT, BOOL) and not flags & PTR):
                out.pop(json_name, None)  # unset: a zero the encoder always writes, or zero time
            else:
                out[json_name] = value
    return out


def _packed(val: int | bytes, kind: str, where: str) -> list[Any]:
    buf = _bytes(_WIRE_BYTES, val, where)
    out: list[Any] = []
    pos = 0
    while pos < len(buf):
        n, pos = _varint(buf, pos, where)
        out.append(_value(kind, None, _WIRE_VARINT, n, where))
    return out


def _map_entry(buf: bytes, kind: str, msg: str | None, where: str) -> tuple[str, Any]:
    key = ""
    value: Any = None
    for num, wire, val in _fields(buf, where):
        if num == 1:
            key = _str(wire, val, f"{where} key")
        elif num == 2:
            value = _value(kind, msg, wire, val, f"{where}[{key!r}]")
    if value is None:  # an entry without a value holds the zero value
        value = _value(kind, msg, _WIRE_BYTES, b"", f"{where}[{key!r}]")
    return key, value


def _value(kind: str, msg: str | None, wire: int, val: int | bytes, where: str) -> Any:
    """One field value in its JSON form; None for a zero `Time`, which JSON leaves out."""
    if kind == STR:
        return _str(wire, val, where)
    if kind == INT:
        return _int(wire, val, where)
    if kind == BOOL:
        return _int(wire, val, where) != 0
    buf = _bytes(wire, val, where)
    if kind == MSG:
        assert msg is not None, where
        return _message(buf, msg, where)
    if kind == BYTES:
        return base64.b64encode(buf).decode("ascii")
    if kind == INTSTR:
        return _int_or_string(buf, where)
    if kind == QUANTITY:
        text = "0"  # the zero Quantity
        for num, fwire, fval in _fields(buf, where):
            if num == 1:
                text = _str(fwire, fval, where)
        return text
    if kind in (TIME, MICROTIME):
        return _time(buf, micro=kind == MICROTIME, where=where)
    if kind == FIELDS:
        return _fields_v1(buf, where)
    if kind == STRINGS:
        return [_str(fwire, fval, where) for num, fwire, fval in _fields(buf, where) if num == 1]
    raise AssertionError(f"unknown field kind {kind!r} at {where}")


def _int_or_string(buf: bytes, where: str) -> int | str:
    is_str, int_val, str_val = False, 0, ""
    for num, wire, val in _fields(buf, where):
        if num == 1:
            is_str = _int(wire, val, where) == 1
        elif num == 2:
            int_val = _int(wire, val, where)
        elif num == 3:
            str_val = _str(wire, val, where)
    return str_val if is_str else int_val


def _time(buf: bytes, *, micro: bool, where: str) -> str | None:
    if not buf:
        return None  # metav1.Time marshals the zero time as an empty message
    seconds = nanos = 0
    for num, wire, val in _fields(buf, where):
        if num == 1:
            seconds = _int(wire, val, where)
        elif num == 2:
            nanos = _int(wire, val, where)
    try:
        t = _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError:
        raise _malformed(where, f"time out of range ({seconds}s)") from None
    if micro:
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _fields_v1(buf: bytes, where: str) -> Any:
    raw = b""
    for num, wire, val in _fields(buf, where):
        if num == 1:
            raw = _bytes(wire, val, where)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _malformed(where, f"fieldsV1 is not JSON: {e}") from None


# -- schema -----------------------------------------------------------------------------------
# Generated from the FileDescriptorProtos in kubectl 1.32; message names drop the "k8s.io.api."
# and "k8s.io.apimachinery.pkg.apis." prefixes of the proto packages.

SCHEMA: Final[dict[str, Message]] = {
    "apps.v1.DaemonSet": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "apps.v1.DaemonSetSpec", 0),
        3: ("status", MSG, "apps.v1.DaemonSetStatus", 0),
    },
    "apps.v1.DaemonSetCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
        3: ("lastTransitionTime", TIME, None, 0), 4: ("reason", STR, None, 0),
        5: ("message", STR, None, 0),
    },
    "apps.v1.DaemonSetSpec": {
        1: ("selector", MSG, "meta.v1.LabelSelector", 0),
        2: ("template", MSG, "core.v1.PodTemplateSpec", 0),
        3: ("updateStrategy", MSG, "apps.v1.DaemonSetUpdateStrategy", 0),
        4: ("minReadySeconds", INT, None, 0), 6: ("revisionHistoryLimit", INT, None, PTR),
    },
    "apps.v1.DaemonSetStatus": {
        1: ("currentNumberScheduled", INT, None, 0), 2: ("numberMisscheduled", INT, None, 0),
        3: ("desiredNumberScheduled", INT, None, 0), 4: ("numberReady", INT, None, 0),
        5: ("observedGeneration", INT, None, 0), 6: ("updatedNumberScheduled", INT, None, 0),
        7: ("numberAvailable", INT, None, 0), 8: ("numberUnavailable", INT, None, 0),
        9: ("collisionCount", INT, None, PTR),
        10: ("conditions", MSG, "apps.v1.DaemonSetCondition", REP),
    },
    "apps.v1.DaemonSetUpdateStrategy": {
        1: ("type", STR, None, 0), 2: ("rollingUpdate", MSG, "apps.v1.RollingUpdateDaemonSet", 0),
    },
    "apps.v1.Deployment": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "apps.v1.DeploymentSpec", 0),
        3: ("status", MSG, "apps.v1.DeploymentStatus", 0),
    },
    "apps.v1.DeploymentCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0), 4: ("reason", STR, None, 0),
        5: ("message", STR, None, 0), 6: ("lastUpdateTime", TIME, None, 0),
        7: ("lastTransitionTime", TIME, None, 0),
    },
    "apps.v1.DeploymentSpec": {
        1: ("replicas", INT, None, PTR), 2: ("selector", MSG, "meta.v1.LabelSelector", 0),
        3: ("template", MSG, "core.v1.PodTemplateSpec", 0),
        4: ("strategy", MSG, "apps.v1.DeploymentStrategy", 0), 5: ("minReadySeconds", INT, None, 0),
        6: ("revisionHistoryLimit", INT, None, PTR), 7: ("paused", BOOL, None, 0),
        9: ("progressDeadlineSeconds", INT, None, PTR),
    },
    "apps.v1.DeploymentStatus": {
        1: ("observedGeneration", INT, None, 0), 2: ("replicas", INT, None, 0),
        3: ("updatedReplicas", INT, None, 0), 4: ("availableReplicas", INT, None, 0),
        5: ("unavailableReplicas", INT, None, 0),
        6: ("conditions", MSG, "apps.v1.DeploymentCondition", REP),
        7: ("readyReplicas", INT, None, 0), 8: ("collisionCount", INT, None, PTR),
    },
    "apps.v1.DeploymentStrategy": {
        1: ("type", STR, None, 0), 2: ("rollingUpdate", MSG, "apps.v1.RollingUpdateDeployment", 0),
    },
    "apps.v1.ReplicaSet": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "apps.v1.ReplicaSetSpec", 0),
        3: ("status", MSG, "apps.v1.ReplicaSetStatus", 0),
    },
    "apps.v1.ReplicaSetCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
        3: ("lastTransitionTime", TIME, None, 0), 4: ("reason", STR, None, 0),
        5: ("message", STR, None, 0),
    },
    "apps.v1.ReplicaSetSpec": {
        1: ("replicas", INT, None, PTR), 2: ("selector", MSG, "meta.v1.LabelSelector", 0),
        3: ("template", MSG, "core.v1.PodTemplateSpec", 0), 4: ("minReadySeconds", INT, None, 0),
    },
    "apps.v1.ReplicaSetStatus": {
        1: ("replicas", INT, None, 0), 2: ("fullyLabeledReplicas", INT, None, 0),
        3: ("observedGeneration", INT, None, 0), 4: ("readyReplicas", INT, None, 0),
        5: ("availableReplicas", INT, None, 0),
        6: ("conditions", MSG, "apps.v1.ReplicaSetCondition", REP),
    },
    "apps.v1.RollingUpdateDaemonSet": {
        1: ("maxUnavailable", INTSTR, None, 0), 2: ("maxSurge", INTSTR, None, 0),
    },
    "apps.v1.RollingUpdateDeployment": {
        1: ("maxUnavailable", INTSTR, None, 0), 2: ("maxSurge", INTSTR, None, 0),
    },
    "apps.v1.RollingUpdateStatefulSetStrategy": {
        1: ("partition", INT, None, PTR), 2: ("maxUnavailable", INTSTR, None, 0),
    },
    "apps.v1.StatefulSet": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "apps.v1.StatefulSetSpec", 0),
        3: ("status", MSG, "apps.v1.StatefulSetStatus", 0),
    },
    "apps.v1.StatefulSetCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
        3: ("lastTransitionTime", TIME, None, 0), 4: ("reason", STR, None, 0),
        5: ("message", STR, None, 0),
    },
    "apps.v1.StatefulSetOrdinals": {
        1: ("start", INT, None, 0),
    },
    "apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicy": {
        1: ("whenDeleted", STR, None, 0), 2: ("whenScaled", STR, None, 0),
    },
    "apps.v1.StatefulSetSpec": {
        1: ("replicas", INT, None, PTR), 2: ("selector", MSG, "meta.v1.LabelSelector", 0),
        3: ("template", MSG, "core.v1.PodTemplateSpec", 0),
        4: ("volumeClaimTemplates", MSG, "core.v1.PersistentVolumeClaim", REP),
        5: ("serviceName", STR, None, 0), 6: ("podManagementPolicy", STR, None, 0),
        7: ("updateStrategy", MSG, "apps.v1.StatefulSetUpdateStrategy", 0),
        8: ("revisionHistoryLimit", INT, None, PTR), 9: ("minReadySeconds", INT, None, 0),
        10: ("persistentVolumeClaimRetentionPolicy", MSG, "apps.v1.StatefulSetPersistentVolumeClaimRetentionPolicy", 0),
        11: ("ordinals", MSG, "apps.v1.StatefulSetOrdinals", 0),
    },
    "apps.v1.StatefulSetStatus": {
        1: ("observedGeneration", INT, None, 0), 2: ("replicas", INT, None, 0),
        3: ("readyReplicas", INT, None, 0), 4: ("currentReplicas", INT, None, 0),
        5: ("updatedReplicas", INT, None, 0), 6: ("currentRevision", STR, None, 0),
        7: ("updateRevision", STR, None, 0), 9: ("collisionCount", INT, None, PTR),
        10: ("conditions", MSG, "apps.v1.StatefulSetCondition", REP),
        11: ("availableReplicas", INT, None, 0),
    },
    "apps.v1.StatefulSetUpdateStrategy": {
        1: ("type", STR, None, 0),
        2: ("rollingUpdate", MSG, "apps.v1.RollingUpdateStatefulSetStrategy", 0),
    },
    # autoscaling/v1 HorizontalPodAutoscaler (`kubectl autoscale`); stored as v2 (fleet/server/hpa_v1.py).
    "autoscaling.v1.CrossVersionObjectReference": {
        1: ("kind", STR, None, 0), 2: ("name", STR, None, 0), 3: ("apiVersion", STR, None, 0),
    },
    "autoscaling.v1.HorizontalPodAutoscaler": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "autoscaling.v1.HorizontalPodAutoscalerSpec", 0),
        3: ("status", MSG, "autoscaling.v1.HorizontalPodAutoscalerStatus", 0),
    },
    "autoscaling.v1.HorizontalPodAutoscalerSpec": {
        1: ("scaleTargetRef", MSG, "autoscaling.v1.CrossVersionObjectReference", 0),
        2: ("minReplicas", INT, None, PTR), 3: ("maxReplicas", INT, None, 0),
        4: ("targetCPUUtilizationPercentage", INT, None, PTR),
    },
    "autoscaling.v1.HorizontalPodAutoscalerStatus": {
        1: ("observedGeneration", INT, None, PTR), 2: ("lastScaleTime", TIME, None, 0),
        3: ("currentReplicas", INT, None, 0), 4: ("desiredReplicas", INT, None, 0),
        5: ("currentCPUUtilizationPercentage", INT, None, PTR),
    },
    "batch.v1.CronJob": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "batch.v1.CronJobSpec", 0),
        3: ("status", MSG, "batch.v1.CronJobStatus", 0),
    },
    "batch.v1.CronJobSpec": {
        1: ("schedule", STR, None, 0), 2: ("startingDeadlineSeconds", INT, None, PTR),
        3: ("concurrencyPolicy", STR, None, 0), 4: ("suspend", BOOL, None, PTR),
        5: ("jobTemplate", MSG, "batch.v1.JobTemplateSpec", 0),
        6: ("successfulJobsHistoryLimit", INT, None, PTR),
        7: ("failedJobsHistoryLimit", INT, None, PTR), 8: ("timeZone", STR, None, PTR),
    },
    "batch.v1.CronJobStatus": {
        1: ("active", MSG, "core.v1.ObjectReference", REP), 4: ("lastScheduleTime", TIME, None, 0),
        5: ("lastSuccessfulTime", TIME, None, 0),
    },
    "batch.v1.Job": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "batch.v1.JobSpec", 0),
        3: ("status", MSG, "batch.v1.JobStatus", 0),
    },
    "batch.v1.JobCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0), 3: ("lastProbeTime", TIME, None, 0),
        4: ("lastTransitionTime", TIME, None, 0), 5: ("reason", STR, None, 0),
        6: ("message", STR, None, 0),
    },
    "batch.v1.JobSpec": {
        1: ("parallelism", INT, None, PTR), 2: ("completions", INT, None, PTR),
        3: ("activeDeadlineSeconds", INT, None, PTR),
        4: ("selector", MSG, "meta.v1.LabelSelector", 0), 5: ("manualSelector", BOOL, None, PTR),
        6: ("template", MSG, "core.v1.PodTemplateSpec", 0), 7: ("backoffLimit", INT, None, PTR),
        8: ("ttlSecondsAfterFinished", INT, None, PTR), 9: ("completionMode", STR, None, PTR),
        10: ("suspend", BOOL, None, PTR),
        11: ("podFailurePolicy", MSG, "batch.v1.PodFailurePolicy", 0),
        12: ("backoffLimitPerIndex", INT, None, PTR), 13: ("maxFailedIndexes", INT, None, PTR),
        14: ("podReplacementPolicy", STR, None, PTR), 15: ("managedBy", STR, None, PTR),
        16: ("successPolicy", MSG, "batch.v1.SuccessPolicy", 0),
    },
    "batch.v1.JobStatus": {
        1: ("conditions", MSG, "batch.v1.JobCondition", REP), 2: ("startTime", TIME, None, 0),
        3: ("completionTime", TIME, None, 0), 4: ("active", INT, None, 0),
        5: ("succeeded", INT, None, 0), 6: ("failed", INT, None, 0),
        7: ("completedIndexes", STR, None, 0),
        8: ("uncountedTerminatedPods", MSG, "batch.v1.UncountedTerminatedPods", 0),
        9: ("ready", INT, None, PTR), 10: ("failedIndexes", STR, None, PTR),
        11: ("terminating", INT, None, PTR),
    },
    "batch.v1.JobTemplateSpec": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "batch.v1.JobSpec", 0),
    },
    "batch.v1.PodFailurePolicy": {
        1: ("rules", MSG, "batch.v1.PodFailurePolicyRule", REP),
    },
    "batch.v1.PodFailurePolicyOnExitCodesRequirement": {
        1: ("containerName", STR, None, PTR), 2: ("operator", STR, None, 0),
        3: ("values", INT, None, REP),
    },
    "batch.v1.PodFailurePolicyOnPodConditionsPattern": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
    },
    "batch.v1.PodFailurePolicyRule": {
        1: ("action", STR, None, 0),
        2: ("onExitCodes", MSG, "batch.v1.PodFailurePolicyOnExitCodesRequirement", 0),
        3: ("onPodConditions", MSG, "batch.v1.PodFailurePolicyOnPodConditionsPattern", REP),
    },
    "batch.v1.SuccessPolicy": {
        1: ("rules", MSG, "batch.v1.SuccessPolicyRule", REP),
    },
    "batch.v1.SuccessPolicyRule": {
        1: ("succeededIndexes", STR, None, PTR), 2: ("succeededCount", INT, None, PTR),
    },
    "batch.v1.UncountedTerminatedPods": {
        1: ("succeeded", STR, None, REP), 2: ("failed", STR, None, REP),
    },
    "coordination.v1.Lease": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "coordination.v1.LeaseSpec", 0),
    },
    "coordination.v1.LeaseSpec": {
        1: ("holderIdentity", STR, None, PTR), 2: ("leaseDurationSeconds", INT, None, PTR),
        3: ("acquireTime", MICROTIME, None, 0), 4: ("renewTime", MICROTIME, None, 0),
        5: ("leaseTransitions", INT, None, PTR), 6: ("strategy", STR, None, PTR),
        7: ("preferredHolder", STR, None, PTR),
    },
    "core.v1.AWSElasticBlockStoreVolumeSource": {
        1: ("volumeID", STR, None, 0), 2: ("fsType", STR, None, 0), 3: ("partition", INT, None, 0),
        4: ("readOnly", BOOL, None, 0),
    },
    "core.v1.Affinity": {
        1: ("nodeAffinity", MSG, "core.v1.NodeAffinity", 0),
        2: ("podAffinity", MSG, "core.v1.PodAffinity", 0),
        3: ("podAntiAffinity", MSG, "core.v1.PodAntiAffinity", 0),
    },
    "core.v1.AppArmorProfile": {
        1: ("type", STR, None, 0), 2: ("localhostProfile", STR, None, PTR),
    },
    "core.v1.AttachedVolume": {
        1: ("name", STR, None, 0), 2: ("devicePath", STR, None, 0),
    },
    "core.v1.AzureDiskVolumeSource": {
        1: ("diskName", STR, None, 0), 2: ("diskURI", STR, None, 0),
        3: ("cachingMode", STR, None, PTR), 4: ("fsType", STR, None, PTR),
        5: ("readOnly", BOOL, None, PTR), 6: ("kind", STR, None, PTR),
    },
    "core.v1.AzureFileVolumeSource": {
        1: ("secretName", STR, None, 0), 2: ("shareName", STR, None, 0),
        3: ("readOnly", BOOL, None, 0),
    },
    "core.v1.CSIVolumeSource": {
        1: ("driver", STR, None, 0), 2: ("readOnly", BOOL, None, PTR),
        3: ("fsType", STR, None, PTR), 4: ("volumeAttributes", STR, None, MAP),
        5: ("nodePublishSecretRef", MSG, "core.v1.LocalObjectReference", 0),
    },
    "core.v1.Capabilities": {
        1: ("add", STR, None, REP), 2: ("drop", STR, None, REP),
    },
    "core.v1.CephFSVolumeSource": {
        1: ("monitors", STR, None, REP), 2: ("path", STR, None, 0), 3: ("user", STR, None, 0),
        4: ("secretFile", STR, None, 0), 5: ("secretRef", MSG, "core.v1.LocalObjectReference", 0),
        6: ("readOnly", BOOL, None, 0),
    },
    "core.v1.CinderVolumeSource": {
        1: ("volumeID", STR, None, 0), 2: ("fsType", STR, None, 0), 3: ("readOnly", BOOL, None, 0),
        4: ("secretRef", MSG, "core.v1.LocalObjectReference", 0),
    },
    "core.v1.ClientIPConfig": {
        1: ("timeoutSeconds", INT, None, PTR),
    },
    "core.v1.ClusterTrustBundleProjection": {
        1: ("name", STR, None, PTR), 2: ("signerName", STR, None, PTR),
        3: ("labelSelector", MSG, "meta.v1.LabelSelector", 0), 4: ("path", STR, None, 0),
        5: ("optional", BOOL, None, PTR),
    },
    "core.v1.ConfigMap": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("data", STR, None, MAP),
        3: ("binaryData", BYTES, None, MAP), 4: ("immutable", BOOL, None, PTR),
    },
    "core.v1.ConfigMapEnvSource": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("optional", BOOL, None, PTR),
    },
    "core.v1.ConfigMapKeySelector": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("key", STR, None, 0), 3: ("optional", BOOL, None, PTR),
    },
    "core.v1.ConfigMapNodeConfigSource": {
        1: ("namespace", STR, None, 0), 2: ("name", STR, None, 0), 3: ("uid", STR, None, 0),
        4: ("resourceVersion", STR, None, 0), 5: ("kubeletConfigKey", STR, None, 0),
    },
    "core.v1.ConfigMapProjection": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("items", MSG, "core.v1.KeyToPath", REP), 4: ("optional", BOOL, None, PTR),
    },
    "core.v1.ConfigMapVolumeSource": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("items", MSG, "core.v1.KeyToPath", REP), 3: ("defaultMode", INT, None, PTR),
        4: ("optional", BOOL, None, PTR),
    },
    "core.v1.Container": {
        1: ("name", STR, None, 0), 2: ("image", STR, None, 0), 3: ("command", STR, None, REP),
        4: ("args", STR, None, REP), 5: ("workingDir", STR, None, 0),
        6: ("ports", MSG, "core.v1.ContainerPort", REP), 7: ("env", MSG, "core.v1.EnvVar", REP),
        8: ("resources", MSG, "core.v1.ResourceRequirements", 0),
        9: ("volumeMounts", MSG, "core.v1.VolumeMount", REP),
        10: ("livenessProbe", MSG, "core.v1.Probe", 0),
        11: ("readinessProbe", MSG, "core.v1.Probe", 0),
        12: ("lifecycle", MSG, "core.v1.Lifecycle", 0),
        13: ("terminationMessagePath", STR, None, 0), 14: ("imagePullPolicy", STR, None, 0),
        15: ("securityContext", MSG, "core.v1.SecurityContext", 0), 16: ("stdin", BOOL, None, 0),
        17: ("stdinOnce", BOOL, None, 0), 18: ("tty", BOOL, None, 0),
        19: ("envFrom", MSG, "core.v1.EnvFromSource", REP),
        20: ("terminationMessagePolicy", STR, None, 0),
        21: ("volumeDevices", MSG, "core.v1.VolumeDevice", REP),
        22: ("startupProbe", MSG, "core.v1.Probe", 0),
        23: ("resizePolicy", MSG, "core.v1.ContainerResizePolicy", REP),
        24: ("restartPolicy", STR, None, PTR),
    },
    "core.v1.ContainerImage": {
        1: ("names", STR, None, REP), 2: ("sizeBytes", INT, None, 0),
    },
    "core.v1.ContainerPort": {
        1: ("name", STR, None, 0), 2: ("hostPort", INT, None, 0),
        3: ("containerPort", INT, None, 0), 4: ("protocol", STR, None, 0),
        5: ("hostIP", STR, None, 0),
    },
    "core.v1.ContainerResizePolicy": {
        1: ("resourceName", STR, None, 0), 2: ("restartPolicy", STR, None, 0),
    },
    "core.v1.ContainerState": {
        1: ("waiting", MSG, "core.v1.ContainerStateWaiting", 0),
        2: ("running", MSG, "core.v1.ContainerStateRunning", 0),
        3: ("terminated", MSG, "core.v1.ContainerStateTerminated", 0),
    },
    "core.v1.ContainerStateRunning": {
        1: ("startedAt", TIME, None, 0),
    },
    "core.v1.ContainerStateTerminated": {
        1: ("exitCode", INT, None, 0), 2: ("signal", INT, None, 0), 3: ("reason", STR, None, 0),
        4: ("message", STR, None, 0), 5: ("startedAt", TIME, None, 0),
        6: ("finishedAt", TIME, None, 0), 7: ("containerID", STR, None, 0),
    },
    "core.v1.ContainerStateWaiting": {
        1: ("reason", STR, None, 0), 2: ("message", STR, None, 0),
    },
    "core.v1.ContainerStatus": {
        1: ("name", STR, None, 0), 2: ("state", MSG, "core.v1.ContainerState", 0),
        3: ("lastState", MSG, "core.v1.ContainerState", 0), 4: ("ready", BOOL, None, 0),
        5: ("restartCount", INT, None, 0), 6: ("image", STR, None, 0), 7: ("imageID", STR, None, 0),
        8: ("containerID", STR, None, 0), 9: ("started", BOOL, None, PTR),
        10: ("allocatedResources", QUANTITY, None, MAP),
        11: ("resources", MSG, "core.v1.ResourceRequirements", 0),
        12: ("volumeMounts", MSG, "core.v1.VolumeMountStatus", REP),
        13: ("user", MSG, "core.v1.ContainerUser", 0),
        14: ("allocatedResourcesStatus", MSG, "core.v1.ResourceStatus", REP),
    },
    "core.v1.ContainerUser": {
        1: ("linux", MSG, "core.v1.LinuxContainerUser", 0),
    },
    "core.v1.DaemonEndpoint": {
        1: ("Port", INT, None, 0),
    },
    "core.v1.DownwardAPIProjection": {
        1: ("items", MSG, "core.v1.DownwardAPIVolumeFile", REP),
    },
    "core.v1.DownwardAPIVolumeFile": {
        1: ("path", STR, None, 0), 2: ("fieldRef", MSG, "core.v1.ObjectFieldSelector", 0),
        3: ("resourceFieldRef", MSG, "core.v1.ResourceFieldSelector", 0),
        4: ("mode", INT, None, PTR),
    },
    "core.v1.DownwardAPIVolumeSource": {
        1: ("items", MSG, "core.v1.DownwardAPIVolumeFile", REP), 2: ("defaultMode", INT, None, PTR),
    },
    "core.v1.EmptyDirVolumeSource": {
        1: ("medium", STR, None, 0), 2: ("sizeLimit", QUANTITY, None, 0),
    },
    "core.v1.EndpointAddress": {
        1: ("ip", STR, None, 0), 2: ("targetRef", MSG, "core.v1.ObjectReference", 0),
        3: ("hostname", STR, None, 0), 4: ("nodeName", STR, None, PTR),
    },
    "core.v1.EndpointPort": {
        1: ("name", STR, None, 0), 2: ("port", INT, None, 0), 3: ("protocol", STR, None, 0),
        4: ("appProtocol", STR, None, PTR),
    },
    "core.v1.EndpointSubset": {
        1: ("addresses", MSG, "core.v1.EndpointAddress", REP),
        2: ("notReadyAddresses", MSG, "core.v1.EndpointAddress", REP),
        3: ("ports", MSG, "core.v1.EndpointPort", REP),
    },
    "core.v1.Endpoints": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("subsets", MSG, "core.v1.EndpointSubset", REP),
    },
    "core.v1.EnvFromSource": {
        1: ("prefix", STR, None, 0), 2: ("configMapRef", MSG, "core.v1.ConfigMapEnvSource", 0),
        3: ("secretRef", MSG, "core.v1.SecretEnvSource", 0),
    },
    "core.v1.EnvVar": {
        1: ("name", STR, None, 0), 2: ("value", STR, None, 0),
        3: ("valueFrom", MSG, "core.v1.EnvVarSource", 0),
    },
    "core.v1.EnvVarSource": {
        1: ("fieldRef", MSG, "core.v1.ObjectFieldSelector", 0),
        2: ("resourceFieldRef", MSG, "core.v1.ResourceFieldSelector", 0),
        3: ("configMapKeyRef", MSG, "core.v1.ConfigMapKeySelector", 0),
        4: ("secretKeyRef", MSG, "core.v1.SecretKeySelector", 0),
    },
    "core.v1.EphemeralContainer": {
        1: ("ephemeralContainerCommon", MSG, "core.v1.EphemeralContainerCommon", INLINE),
        2: ("targetContainerName", STR, None, 0),
    },
    "core.v1.EphemeralContainerCommon": {
        1: ("name", STR, None, 0), 2: ("image", STR, None, 0), 3: ("command", STR, None, REP),
        4: ("args", STR, None, REP), 5: ("workingDir", STR, None, 0),
        6: ("ports", MSG, "core.v1.ContainerPort", REP), 7: ("env", MSG, "core.v1.EnvVar", REP),
        8: ("resources", MSG, "core.v1.ResourceRequirements", 0),
        9: ("volumeMounts", MSG, "core.v1.VolumeMount", REP),
        10: ("livenessProbe", MSG, "core.v1.Probe", 0),
        11: ("readinessProbe", MSG, "core.v1.Probe", 0),
        12: ("lifecycle", MSG, "core.v1.Lifecycle", 0),
        13: ("terminationMessagePath", STR, None, 0), 14: ("imagePullPolicy", STR, None, 0),
        15: ("securityContext", MSG, "core.v1.SecurityContext", 0), 16: ("stdin", BOOL, None, 0),
        17: ("stdinOnce", BOOL, None, 0), 18: ("tty", BOOL, None, 0),
        19: ("envFrom", MSG, "core.v1.EnvFromSource", REP),
        20: ("terminationMessagePolicy", STR, None, 0),
        21: ("volumeDevices", MSG, "core.v1.VolumeDevice", REP),
        22: ("startupProbe", MSG, "core.v1.Probe", 0),
        23: ("resizePolicy", MSG, "core.v1.ContainerResizePolicy", REP),
        24: ("restartPolicy", STR, None, PTR),
    },
    "core.v1.EphemeralVolumeSource": {
        1: ("volumeClaimTemplate", MSG, "core.v1.PersistentVolumeClaimTemplate", 0),
    },
    "core.v1.Event": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("involvedObject", MSG, "core.v1.ObjectReference", 0), 3: ("reason", STR, None, 0),
        4: ("message", STR, None, 0), 5: ("source", MSG, "core.v1.EventSource", 0),
        6: ("firstTimestamp", TIME, None, 0), 7: ("lastTimestamp", TIME, None, 0),
        8: ("count", INT, None, 0), 9: ("type", STR, None, 0),
        10: ("eventTime", MICROTIME, None, 0), 11: ("series", MSG, "core.v1.EventSeries", 0),
        12: ("action", STR, None, 0), 13: ("related", MSG, "core.v1.ObjectReference", 0),
        14: ("reportingComponent", STR, None, 0), 15: ("reportingInstance", STR, None, 0),
    },
    "core.v1.EventSeries": {
        1: ("count", INT, None, 0), 2: ("lastObservedTime", MICROTIME, None, 0),
    },
    "core.v1.EventSource": {
        1: ("component", STR, None, 0), 2: ("host", STR, None, 0),
    },
    "core.v1.ExecAction": {
        1: ("command", STR, None, REP),
    },
    "core.v1.FCVolumeSource": {
        1: ("targetWWNs", STR, None, REP), 2: ("lun", INT, None, PTR), 3: ("fsType", STR, None, 0),
        4: ("readOnly", BOOL, None, 0), 5: ("wwids", STR, None, REP),
    },
    "core.v1.FlexVolumeSource": {
        1: ("driver", STR, None, 0), 2: ("fsType", STR, None, 0),
        3: ("secretRef", MSG, "core.v1.LocalObjectReference", 0), 4: ("readOnly", BOOL, None, 0),
        5: ("options", STR, None, MAP),
    },
    "core.v1.FlockerVolumeSource": {
        1: ("datasetName", STR, None, 0), 2: ("datasetUUID", STR, None, 0),
    },
    "core.v1.GCEPersistentDiskVolumeSource": {
        1: ("pdName", STR, None, 0), 2: ("fsType", STR, None, 0), 3: ("partition", INT, None, 0),
        4: ("readOnly", BOOL, None, 0),
    },
    "core.v1.GRPCAction": {
        1: ("port", INT, None, 0), 2: ("service", STR, None, PTR),
    },
    "core.v1.GitRepoVolumeSource": {
        1: ("repository", STR, None, 0), 2: ("revision", STR, None, 0),
        3: ("directory", STR, None, 0),
    },
    "core.v1.GlusterfsVolumeSource": {
        1: ("endpoints", STR, None, 0), 2: ("path", STR, None, 0), 3: ("readOnly", BOOL, None, 0),
    },
    "core.v1.HTTPGetAction": {
        1: ("path", STR, None, 0), 2: ("port", INTSTR, None, 0), 3: ("host", STR, None, 0),
        4: ("scheme", STR, None, 0), 5: ("httpHeaders", MSG, "core.v1.HTTPHeader", REP),
    },
    "core.v1.HTTPHeader": {
        1: ("name", STR, None, 0), 2: ("value", STR, None, 0),
    },
    "core.v1.HostAlias": {
        1: ("ip", STR, None, 0), 2: ("hostnames", STR, None, REP),
    },
    "core.v1.HostIP": {
        1: ("ip", STR, None, 0),
    },
    "core.v1.HostPathVolumeSource": {
        1: ("path", STR, None, 0), 2: ("type", STR, None, PTR),
    },
    "core.v1.ISCSIVolumeSource": {
        1: ("targetPortal", STR, None, 0), 2: ("iqn", STR, None, 0), 3: ("lun", INT, None, 0),
        4: ("iscsiInterface", STR, None, 0), 5: ("fsType", STR, None, 0),
        6: ("readOnly", BOOL, None, 0), 7: ("portals", STR, None, REP),
        8: ("chapAuthDiscovery", BOOL, None, 0),
        10: ("secretRef", MSG, "core.v1.LocalObjectReference", 0),
        11: ("chapAuthSession", BOOL, None, 0), 12: ("initiatorName", STR, None, PTR),
    },
    "core.v1.ImageVolumeSource": {
        1: ("reference", STR, None, 0), 2: ("pullPolicy", STR, None, 0),
    },
    "core.v1.KeyToPath": {
        1: ("key", STR, None, 0), 2: ("path", STR, None, 0), 3: ("mode", INT, None, PTR),
    },
    "core.v1.Lifecycle": {
        1: ("postStart", MSG, "core.v1.LifecycleHandler", 0),
        2: ("preStop", MSG, "core.v1.LifecycleHandler", 0),
    },
    "core.v1.LifecycleHandler": {
        1: ("exec", MSG, "core.v1.ExecAction", 0), 2: ("httpGet", MSG, "core.v1.HTTPGetAction", 0),
        3: ("tcpSocket", MSG, "core.v1.TCPSocketAction", 0),
        4: ("sleep", MSG, "core.v1.SleepAction", 0),
    },
    "core.v1.LinuxContainerUser": {
        1: ("uid", INT, None, 0), 2: ("gid", INT, None, 0),
        3: ("supplementalGroups", INT, None, REP),
    },
    "core.v1.LoadBalancerIngress": {
        1: ("ip", STR, None, 0), 2: ("hostname", STR, None, 0), 3: ("ipMode", STR, None, PTR),
        4: ("ports", MSG, "core.v1.PortStatus", REP),
    },
    "core.v1.LoadBalancerStatus": {
        1: ("ingress", MSG, "core.v1.LoadBalancerIngress", REP),
    },
    "core.v1.LocalObjectReference": {
        1: ("name", STR, None, 0),
    },
    "core.v1.ModifyVolumeStatus": {
        1: ("targetVolumeAttributesClassName", STR, None, 0), 2: ("status", STR, None, 0),
    },
    "core.v1.NFSVolumeSource": {
        1: ("server", STR, None, 0), 2: ("path", STR, None, 0), 3: ("readOnly", BOOL, None, 0),
    },
    "core.v1.Namespace": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.NamespaceSpec", 0),
        3: ("status", MSG, "core.v1.NamespaceStatus", 0),
    },
    "core.v1.NamespaceCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
        4: ("lastTransitionTime", TIME, None, 0), 5: ("reason", STR, None, 0),
        6: ("message", STR, None, 0),
    },
    "core.v1.NamespaceSpec": {
        1: ("finalizers", STR, None, REP),
    },
    "core.v1.NamespaceStatus": {
        1: ("phase", STR, None, 0), 2: ("conditions", MSG, "core.v1.NamespaceCondition", REP),
    },
    "core.v1.Node": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.NodeSpec", 0),
        3: ("status", MSG, "core.v1.NodeStatus", 0),
    },
    "core.v1.NodeAddress": {
        1: ("type", STR, None, 0), 2: ("address", STR, None, 0),
    },
    "core.v1.NodeAffinity": {
        1: ("requiredDuringSchedulingIgnoredDuringExecution", MSG, "core.v1.NodeSelector", 0),
        2: ("preferredDuringSchedulingIgnoredDuringExecution", MSG, "core.v1.PreferredSchedulingTerm", REP),
    },
    "core.v1.NodeCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
        3: ("lastHeartbeatTime", TIME, None, 0), 4: ("lastTransitionTime", TIME, None, 0),
        5: ("reason", STR, None, 0), 6: ("message", STR, None, 0),
    },
    "core.v1.NodeConfigSource": {
        2: ("configMap", MSG, "core.v1.ConfigMapNodeConfigSource", 0),
    },
    "core.v1.NodeConfigStatus": {
        1: ("assigned", MSG, "core.v1.NodeConfigSource", 0),
        2: ("active", MSG, "core.v1.NodeConfigSource", 0),
        3: ("lastKnownGood", MSG, "core.v1.NodeConfigSource", 0), 4: ("error", STR, None, 0),
    },
    "core.v1.NodeDaemonEndpoints": {
        1: ("kubeletEndpoint", MSG, "core.v1.DaemonEndpoint", 0),
    },
    "core.v1.NodeFeatures": {
        1: ("supplementalGroupsPolicy", BOOL, None, PTR),
    },
    "core.v1.NodeRuntimeHandler": {
        1: ("name", STR, None, 0), 2: ("features", MSG, "core.v1.NodeRuntimeHandlerFeatures", 0),
    },
    "core.v1.NodeRuntimeHandlerFeatures": {
        1: ("recursiveReadOnlyMounts", BOOL, None, PTR), 2: ("userNamespaces", BOOL, None, PTR),
    },
    "core.v1.NodeSelector": {
        1: ("nodeSelectorTerms", MSG, "core.v1.NodeSelectorTerm", REP),
    },
    "core.v1.NodeSelectorRequirement": {
        1: ("key", STR, None, 0), 2: ("operator", STR, None, 0), 3: ("values", STR, None, REP),
    },
    "core.v1.NodeSelectorTerm": {
        1: ("matchExpressions", MSG, "core.v1.NodeSelectorRequirement", REP),
        2: ("matchFields", MSG, "core.v1.NodeSelectorRequirement", REP),
    },
    "core.v1.NodeSpec": {
        1: ("podCIDR", STR, None, 0), 2: ("externalID", STR, None, 0),
        3: ("providerID", STR, None, 0), 4: ("unschedulable", BOOL, None, 0),
        5: ("taints", MSG, "core.v1.Taint", REP),
        6: ("configSource", MSG, "core.v1.NodeConfigSource", 0), 7: ("podCIDRs", STR, None, REP),
    },
    "core.v1.NodeStatus": {
        1: ("capacity", QUANTITY, None, MAP), 2: ("allocatable", QUANTITY, None, MAP),
        3: ("phase", STR, None, 0), 4: ("conditions", MSG, "core.v1.NodeCondition", REP),
        5: ("addresses", MSG, "core.v1.NodeAddress", REP),
        6: ("daemonEndpoints", MSG, "core.v1.NodeDaemonEndpoints", 0),
        7: ("nodeInfo", MSG, "core.v1.NodeSystemInfo", 0),
        8: ("images", MSG, "core.v1.ContainerImage", REP), 9: ("volumesInUse", STR, None, REP),
        10: ("volumesAttached", MSG, "core.v1.AttachedVolume", REP),
        11: ("config", MSG, "core.v1.NodeConfigStatus", 0),
        12: ("runtimeHandlers", MSG, "core.v1.NodeRuntimeHandler", REP),
        13: ("features", MSG, "core.v1.NodeFeatures", 0),
    },
    "core.v1.NodeSystemInfo": {
        1: ("machineID", STR, None, 0), 2: ("systemUUID", STR, None, 0),
        3: ("bootID", STR, None, 0), 4: ("kernelVersion", STR, None, 0),
        5: ("osImage", STR, None, 0), 6: ("containerRuntimeVersion", STR, None, 0),
        7: ("kubeletVersion", STR, None, 0), 8: ("kubeProxyVersion", STR, None, 0),
        9: ("operatingSystem", STR, None, 0), 10: ("architecture", STR, None, 0),
    },
    "core.v1.ObjectFieldSelector": {
        1: ("apiVersion", STR, None, 0), 2: ("fieldPath", STR, None, 0),
    },
    "core.v1.ObjectReference": {
        1: ("kind", STR, None, 0), 2: ("namespace", STR, None, 0), 3: ("name", STR, None, 0),
        4: ("uid", STR, None, 0), 5: ("apiVersion", STR, None, 0),
        6: ("resourceVersion", STR, None, 0), 7: ("fieldPath", STR, None, 0),
    },
    "core.v1.PersistentVolumeClaim": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "core.v1.PersistentVolumeClaimSpec", 0),
        3: ("status", MSG, "core.v1.PersistentVolumeClaimStatus", 0),
    },
    "core.v1.PersistentVolumeClaimCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0), 3: ("lastProbeTime", TIME, None, 0),
        4: ("lastTransitionTime", TIME, None, 0), 5: ("reason", STR, None, 0),
        6: ("message", STR, None, 0),
    },
    "core.v1.PersistentVolumeClaimSpec": {
        1: ("accessModes", STR, None, REP),
        2: ("resources", MSG, "core.v1.VolumeResourceRequirements", 0),
        3: ("volumeName", STR, None, 0), 4: ("selector", MSG, "meta.v1.LabelSelector", 0),
        5: ("storageClassName", STR, None, PTR), 6: ("volumeMode", STR, None, PTR),
        7: ("dataSource", MSG, "core.v1.TypedLocalObjectReference", 0),
        8: ("dataSourceRef", MSG, "core.v1.TypedObjectReference", 0),
        9: ("volumeAttributesClassName", STR, None, PTR),
    },
    "core.v1.PersistentVolumeClaimStatus": {
        1: ("phase", STR, None, 0), 2: ("accessModes", STR, None, REP),
        3: ("capacity", QUANTITY, None, MAP),
        4: ("conditions", MSG, "core.v1.PersistentVolumeClaimCondition", REP),
        5: ("allocatedResources", QUANTITY, None, MAP),
        7: ("allocatedResourceStatuses", STR, None, MAP),
        8: ("currentVolumeAttributesClassName", STR, None, PTR),
        9: ("modifyVolumeStatus", MSG, "core.v1.ModifyVolumeStatus", 0),
    },
    "core.v1.PersistentVolumeClaimTemplate": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "core.v1.PersistentVolumeClaimSpec", 0),
    },
    "core.v1.PersistentVolumeClaimVolumeSource": {
        1: ("claimName", STR, None, 0), 2: ("readOnly", BOOL, None, 0),
    },
    "core.v1.PhotonPersistentDiskVolumeSource": {
        1: ("pdID", STR, None, 0), 2: ("fsType", STR, None, 0),
    },
    "core.v1.Pod": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.PodSpec", 0),
        3: ("status", MSG, "core.v1.PodStatus", 0),
    },
    "core.v1.PodAffinity": {
        1: ("requiredDuringSchedulingIgnoredDuringExecution", MSG, "core.v1.PodAffinityTerm", REP),
        2: ("preferredDuringSchedulingIgnoredDuringExecution", MSG, "core.v1.WeightedPodAffinityTerm", REP),
    },
    "core.v1.PodAffinityTerm": {
        1: ("labelSelector", MSG, "meta.v1.LabelSelector", 0), 2: ("namespaces", STR, None, REP),
        3: ("topologyKey", STR, None, 0), 4: ("namespaceSelector", MSG, "meta.v1.LabelSelector", 0),
        5: ("matchLabelKeys", STR, None, REP), 6: ("mismatchLabelKeys", STR, None, REP),
    },
    "core.v1.PodAntiAffinity": {
        1: ("requiredDuringSchedulingIgnoredDuringExecution", MSG, "core.v1.PodAffinityTerm", REP),
        2: ("preferredDuringSchedulingIgnoredDuringExecution", MSG, "core.v1.WeightedPodAffinityTerm", REP),
    },
    "core.v1.PodCondition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0), 3: ("lastProbeTime", TIME, None, 0),
        4: ("lastTransitionTime", TIME, None, 0), 5: ("reason", STR, None, 0),
        6: ("message", STR, None, 0),
    },
    "core.v1.PodDNSConfig": {
        1: ("nameservers", STR, None, REP), 2: ("searches", STR, None, REP),
        3: ("options", MSG, "core.v1.PodDNSConfigOption", REP),
    },
    "core.v1.PodDNSConfigOption": {
        1: ("name", STR, None, 0), 2: ("value", STR, None, PTR),
    },
    "core.v1.PodIP": {
        1: ("ip", STR, None, 0),
    },
    "core.v1.PodOS": {
        1: ("name", STR, None, 0),
    },
    "core.v1.PodReadinessGate": {
        1: ("conditionType", STR, None, 0),
    },
    "core.v1.PodResourceClaim": {
        1: ("name", STR, None, 0), 3: ("resourceClaimName", STR, None, PTR),
        4: ("resourceClaimTemplateName", STR, None, PTR),
    },
    "core.v1.PodResourceClaimStatus": {
        1: ("name", STR, None, 0), 2: ("resourceClaimName", STR, None, PTR),
    },
    "core.v1.PodSchedulingGate": {
        1: ("name", STR, None, 0),
    },
    "core.v1.PodSecurityContext": {
        1: ("seLinuxOptions", MSG, "core.v1.SELinuxOptions", 0), 2: ("runAsUser", INT, None, PTR),
        3: ("runAsNonRoot", BOOL, None, PTR), 4: ("supplementalGroups", INT, None, REP),
        5: ("fsGroup", INT, None, PTR), 6: ("runAsGroup", INT, None, PTR),
        7: ("sysctls", MSG, "core.v1.Sysctl", REP),
        8: ("windowsOptions", MSG, "core.v1.WindowsSecurityContextOptions", 0),
        9: ("fsGroupChangePolicy", STR, None, PTR),
        10: ("seccompProfile", MSG, "core.v1.SeccompProfile", 0),
        11: ("appArmorProfile", MSG, "core.v1.AppArmorProfile", 0),
        12: ("supplementalGroupsPolicy", STR, None, PTR),
        13: ("seLinuxChangePolicy", STR, None, PTR),
    },
    "core.v1.PodSpec": {
        1: ("volumes", MSG, "core.v1.Volume", REP),
        2: ("containers", MSG, "core.v1.Container", REP), 3: ("restartPolicy", STR, None, 0),
        4: ("terminationGracePeriodSeconds", INT, None, PTR),
        5: ("activeDeadlineSeconds", INT, None, PTR), 6: ("dnsPolicy", STR, None, 0),
        7: ("nodeSelector", STR, None, MAP), 8: ("serviceAccountName", STR, None, 0),
        9: ("serviceAccount", STR, None, 0), 10: ("nodeName", STR, None, 0),
        11: ("hostNetwork", BOOL, None, 0), 12: ("hostPID", BOOL, None, 0),
        13: ("hostIPC", BOOL, None, 0),
        14: ("securityContext", MSG, "core.v1.PodSecurityContext", 0),
        15: ("imagePullSecrets", MSG, "core.v1.LocalObjectReference", REP),
        16: ("hostname", STR, None, 0), 17: ("subdomain", STR, None, 0),
        18: ("affinity", MSG, "core.v1.Affinity", 0), 19: ("schedulerName", STR, None, 0),
        20: ("initContainers", MSG, "core.v1.Container", REP),
        21: ("automountServiceAccountToken", BOOL, None, PTR),
        22: ("tolerations", MSG, "core.v1.Toleration", REP),
        23: ("hostAliases", MSG, "core.v1.HostAlias", REP), 24: ("priorityClassName", STR, None, 0),
        25: ("priority", INT, None, PTR), 26: ("dnsConfig", MSG, "core.v1.PodDNSConfig", 0),
        27: ("shareProcessNamespace", BOOL, None, PTR),
        28: ("readinessGates", MSG, "core.v1.PodReadinessGate", REP),
        29: ("runtimeClassName", STR, None, PTR), 30: ("enableServiceLinks", BOOL, None, PTR),
        31: ("preemptionPolicy", STR, None, PTR), 32: ("overhead", QUANTITY, None, MAP),
        33: ("topologySpreadConstraints", MSG, "core.v1.TopologySpreadConstraint", REP),
        34: ("ephemeralContainers", MSG, "core.v1.EphemeralContainer", REP),
        35: ("setHostnameAsFQDN", BOOL, None, PTR), 36: ("os", MSG, "core.v1.PodOS", 0),
        37: ("hostUsers", BOOL, None, PTR),
        38: ("schedulingGates", MSG, "core.v1.PodSchedulingGate", REP),
        39: ("resourceClaims", MSG, "core.v1.PodResourceClaim", REP),
        40: ("resources", MSG, "core.v1.ResourceRequirements", 0),
    },
    "core.v1.PodStatus": {
        1: ("phase", STR, None, 0), 2: ("conditions", MSG, "core.v1.PodCondition", REP),
        3: ("message", STR, None, 0), 4: ("reason", STR, None, 0), 5: ("hostIP", STR, None, 0),
        6: ("podIP", STR, None, 0), 7: ("startTime", TIME, None, 0),
        8: ("containerStatuses", MSG, "core.v1.ContainerStatus", REP),
        9: ("qosClass", STR, None, 0),
        10: ("initContainerStatuses", MSG, "core.v1.ContainerStatus", REP),
        11: ("nominatedNodeName", STR, None, 0), 12: ("podIPs", MSG, "core.v1.PodIP", REP),
        13: ("ephemeralContainerStatuses", MSG, "core.v1.ContainerStatus", REP),
        14: ("resize", STR, None, 0),
        15: ("resourceClaimStatuses", MSG, "core.v1.PodResourceClaimStatus", REP),
        16: ("hostIPs", MSG, "core.v1.HostIP", REP),
    },
    "core.v1.PodTemplateSpec": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.PodSpec", 0),
    },
    "core.v1.PortStatus": {
        1: ("port", INT, None, 0), 2: ("protocol", STR, None, 0), 3: ("error", STR, None, PTR),
    },
    "core.v1.PortworxVolumeSource": {
        1: ("volumeID", STR, None, 0), 2: ("fsType", STR, None, 0), 3: ("readOnly", BOOL, None, 0),
    },
    "core.v1.PreferredSchedulingTerm": {
        1: ("weight", INT, None, 0), 2: ("preference", MSG, "core.v1.NodeSelectorTerm", 0),
    },
    "core.v1.Probe": {
        1: ("handler", MSG, "core.v1.ProbeHandler", INLINE),
        2: ("initialDelaySeconds", INT, None, 0), 3: ("timeoutSeconds", INT, None, 0),
        4: ("periodSeconds", INT, None, 0), 5: ("successThreshold", INT, None, 0),
        6: ("failureThreshold", INT, None, 0), 7: ("terminationGracePeriodSeconds", INT, None, PTR),
    },
    "core.v1.ProbeHandler": {
        1: ("exec", MSG, "core.v1.ExecAction", 0), 2: ("httpGet", MSG, "core.v1.HTTPGetAction", 0),
        3: ("tcpSocket", MSG, "core.v1.TCPSocketAction", 0),
        4: ("grpc", MSG, "core.v1.GRPCAction", 0),
    },
    "core.v1.ProjectedVolumeSource": {
        1: ("sources", MSG, "core.v1.VolumeProjection", REP), 2: ("defaultMode", INT, None, PTR),
    },
    "core.v1.QuobyteVolumeSource": {
        1: ("registry", STR, None, 0), 2: ("volume", STR, None, 0), 3: ("readOnly", BOOL, None, 0),
        4: ("user", STR, None, 0), 5: ("group", STR, None, 0), 6: ("tenant", STR, None, 0),
    },
    "core.v1.RBDVolumeSource": {
        1: ("monitors", STR, None, REP), 2: ("image", STR, None, 0), 3: ("fsType", STR, None, 0),
        4: ("pool", STR, None, 0), 5: ("user", STR, None, 0), 6: ("keyring", STR, None, 0),
        7: ("secretRef", MSG, "core.v1.LocalObjectReference", 0), 8: ("readOnly", BOOL, None, 0),
    },
    "core.v1.ResourceClaim": {
        1: ("name", STR, None, 0), 2: ("request", STR, None, 0),
    },
    "core.v1.ResourceFieldSelector": {
        1: ("containerName", STR, None, 0), 2: ("resource", STR, None, 0),
        3: ("divisor", QUANTITY, None, 0),
    },
    "core.v1.ResourceHealth": {
        1: ("resourceID", STR, None, 0), 2: ("health", STR, None, 0),
    },
    "core.v1.ResourceRequirements": {
        1: ("limits", QUANTITY, None, MAP), 2: ("requests", QUANTITY, None, MAP),
        3: ("claims", MSG, "core.v1.ResourceClaim", REP),
    },
    "core.v1.ResourceStatus": {
        1: ("name", STR, None, 0), 2: ("resources", MSG, "core.v1.ResourceHealth", REP),
    },
    "core.v1.SELinuxOptions": {
        1: ("user", STR, None, 0), 2: ("role", STR, None, 0), 3: ("type", STR, None, 0),
        4: ("level", STR, None, 0),
    },
    "core.v1.ScaleIOVolumeSource": {
        1: ("gateway", STR, None, 0), 2: ("system", STR, None, 0),
        3: ("secretRef", MSG, "core.v1.LocalObjectReference", 0), 4: ("sslEnabled", BOOL, None, 0),
        5: ("protectionDomain", STR, None, 0), 6: ("storagePool", STR, None, 0),
        7: ("storageMode", STR, None, 0), 8: ("volumeName", STR, None, 0),
        9: ("fsType", STR, None, 0), 10: ("readOnly", BOOL, None, 0),
    },
    "core.v1.SeccompProfile": {
        1: ("type", STR, None, 0), 2: ("localhostProfile", STR, None, PTR),
    },
    "core.v1.Secret": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("data", BYTES, None, MAP),
        3: ("type", STR, None, 0), 4: ("stringData", STR, None, MAP),
        5: ("immutable", BOOL, None, PTR),
    },
    "core.v1.SecretEnvSource": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("optional", BOOL, None, PTR),
    },
    "core.v1.SecretKeySelector": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("key", STR, None, 0), 3: ("optional", BOOL, None, PTR),
    },
    "core.v1.SecretProjection": {
        1: ("localObjectReference", MSG, "core.v1.LocalObjectReference", INLINE),
        2: ("items", MSG, "core.v1.KeyToPath", REP), 4: ("optional", BOOL, None, PTR),
    },
    "core.v1.SecretVolumeSource": {
        1: ("secretName", STR, None, 0), 2: ("items", MSG, "core.v1.KeyToPath", REP),
        3: ("defaultMode", INT, None, PTR), 4: ("optional", BOOL, None, PTR),
    },
    "core.v1.SecurityContext": {
        1: ("capabilities", MSG, "core.v1.Capabilities", 0), 2: ("privileged", BOOL, None, PTR),
        3: ("seLinuxOptions", MSG, "core.v1.SELinuxOptions", 0), 4: ("runAsUser", INT, None, PTR),
        5: ("runAsNonRoot", BOOL, None, PTR), 6: ("readOnlyRootFilesystem", BOOL, None, PTR),
        7: ("allowPrivilegeEscalation", BOOL, None, PTR), 8: ("runAsGroup", INT, None, PTR),
        9: ("procMount", STR, None, PTR),
        10: ("windowsOptions", MSG, "core.v1.WindowsSecurityContextOptions", 0),
        11: ("seccompProfile", MSG, "core.v1.SeccompProfile", 0),
        12: ("appArmorProfile", MSG, "core.v1.AppArmorProfile", 0),
    },
    "core.v1.Service": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.ServiceSpec", 0),
        3: ("status", MSG, "core.v1.ServiceStatus", 0),
    },
    "core.v1.ServiceAccount": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("secrets", MSG, "core.v1.ObjectReference", REP),
        3: ("imagePullSecrets", MSG, "core.v1.LocalObjectReference", REP),
        4: ("automountServiceAccountToken", BOOL, None, PTR),
    },
    "core.v1.ServiceAccountTokenProjection": {
        1: ("audience", STR, None, 0), 2: ("expirationSeconds", INT, None, PTR),
        3: ("path", STR, None, 0),
    },
    "core.v1.ServicePort": {
        1: ("name", STR, None, 0), 2: ("protocol", STR, None, 0), 3: ("port", INT, None, 0),
        4: ("targetPort", INTSTR, None, 0), 5: ("nodePort", INT, None, 0),
        6: ("appProtocol", STR, None, PTR),
    },
    "core.v1.ServiceSpec": {
        1: ("ports", MSG, "core.v1.ServicePort", REP), 2: ("selector", STR, None, MAP),
        3: ("clusterIP", STR, None, 0), 4: ("type", STR, None, 0),
        5: ("externalIPs", STR, None, REP), 7: ("sessionAffinity", STR, None, 0),
        8: ("loadBalancerIP", STR, None, 0), 9: ("loadBalancerSourceRanges", STR, None, REP),
        10: ("externalName", STR, None, 0), 11: ("externalTrafficPolicy", STR, None, 0),
        12: ("healthCheckNodePort", INT, None, 0), 13: ("publishNotReadyAddresses", BOOL, None, 0),
        14: ("sessionAffinityConfig", MSG, "core.v1.SessionAffinityConfig", 0),
        17: ("ipFamilyPolicy", STR, None, PTR), 18: ("clusterIPs", STR, None, REP),
        19: ("ipFamilies", STR, None, REP), 20: ("allocateLoadBalancerNodePorts", BOOL, None, PTR),
        21: ("loadBalancerClass", STR, None, PTR), 22: ("internalTrafficPolicy", STR, None, PTR),
        23: ("trafficDistribution", STR, None, PTR),
    },
    "core.v1.ServiceStatus": {
        1: ("loadBalancer", MSG, "core.v1.LoadBalancerStatus", 0),
        2: ("conditions", MSG, "meta.v1.Condition", REP),
    },
    "core.v1.SessionAffinityConfig": {
        1: ("clientIP", MSG, "core.v1.ClientIPConfig", 0),
    },
    "core.v1.SleepAction": {
        1: ("seconds", INT, None, 0),
    },
    "core.v1.StorageOSVolumeSource": {
        1: ("volumeName", STR, None, 0), 2: ("volumeNamespace", STR, None, 0),
        3: ("fsType", STR, None, 0), 4: ("readOnly", BOOL, None, 0),
        5: ("secretRef", MSG, "core.v1.LocalObjectReference", 0),
    },
    "core.v1.Sysctl": {
        1: ("name", STR, None, 0), 2: ("value", STR, None, 0),
    },
    "core.v1.TCPSocketAction": {
        1: ("port", INTSTR, None, 0), 2: ("host", STR, None, 0),
    },
    "core.v1.Taint": {
        1: ("key", STR, None, 0), 2: ("value", STR, None, 0), 3: ("effect", STR, None, 0),
        4: ("timeAdded", TIME, None, 0),
    },
    "core.v1.Toleration": {
        1: ("key", STR, None, 0), 2: ("operator", STR, None, 0), 3: ("value", STR, None, 0),
        4: ("effect", STR, None, 0), 5: ("tolerationSeconds", INT, None, PTR),
    },
    "core.v1.TopologySpreadConstraint": {
        1: ("maxSkew", INT, None, 0), 2: ("topologyKey", STR, None, 0),
        3: ("whenUnsatisfiable", STR, None, 0),
        4: ("labelSelector", MSG, "meta.v1.LabelSelector", 0), 5: ("minDomains", INT, None, PTR),
        6: ("nodeAffinityPolicy", STR, None, PTR), 7: ("nodeTaintsPolicy", STR, None, PTR),
        8: ("matchLabelKeys", STR, None, REP),
    },
    "core.v1.TypedLocalObjectReference": {
        1: ("apiGroup", STR, None, PTR), 2: ("kind", STR, None, 0), 3: ("name", STR, None, 0),
    },
    "core.v1.TypedObjectReference": {
        1: ("apiGroup", STR, None, PTR), 2: ("kind", STR, None, 0), 3: ("name", STR, None, 0),
        4: ("namespace", STR, None, PTR),
    },
    "core.v1.Volume": {
        1: ("name", STR, None, 0), 2: ("volumeSource", MSG, "core.v1.VolumeSource", INLINE),
    },
    "core.v1.VolumeDevice": {
        1: ("name", STR, None, 0), 2: ("devicePath", STR, None, 0),
    },
    "core.v1.VolumeMount": {
        1: ("name", STR, None, 0), 2: ("readOnly", BOOL, None, 0), 3: ("mountPath", STR, None, 0),
        4: ("subPath", STR, None, 0), 5: ("mountPropagation", STR, None, PTR),
        6: ("subPathExpr", STR, None, 0), 7: ("recursiveReadOnly", STR, None, PTR),
    },
    "core.v1.VolumeMountStatus": {
        1: ("name", STR, None, 0), 2: ("mountPath", STR, None, 0), 3: ("readOnly", BOOL, None, 0),
        4: ("recursiveReadOnly", STR, None, PTR),
    },
    "core.v1.VolumeProjection": {
        1: ("secret", MSG, "core.v1.SecretProjection", 0),
        2: ("downwardAPI", MSG, "core.v1.DownwardAPIProjection", 0),
        3: ("configMap", MSG, "core.v1.ConfigMapProjection", 0),
        4: ("serviceAccountToken", MSG, "core.v1.ServiceAccountTokenProjection", 0),
        5: ("clusterTrustBundle", MSG, "core.v1.ClusterTrustBundleProjection", 0),
    },
    "core.v1.VolumeResourceRequirements": {
        1: ("limits", QUANTITY, None, MAP), 2: ("requests", QUANTITY, None, MAP),
    },
    "core.v1.VolumeSource": {
        1: ("hostPath", MSG, "core.v1.HostPathVolumeSource", 0),
        2: ("emptyDir", MSG, "core.v1.EmptyDirVolumeSource", 0),
        3: ("gcePersistentDisk", MSG, "core.v1.GCEPersistentDiskVolumeSource", 0),
        4: ("awsElasticBlockStore", MSG, "core.v1.AWSElasticBlockStoreVolumeSource", 0),
        5: ("gitRepo", MSG, "core.v1.GitRepoVolumeSource", 0),
        6: ("secret", MSG, "core.v1.SecretVolumeSource", 0),
        7: ("nfs", MSG, "core.v1.NFSVolumeSource", 0),
        8: ("iscsi", MSG, "core.v1.ISCSIVolumeSource", 0),
        9: ("glusterfs", MSG, "core.v1.GlusterfsVolumeSource", 0),
        10: ("persistentVolumeClaim", MSG, "core.v1.PersistentVolumeClaimVolumeSource", 0),
        11: ("rbd", MSG, "core.v1.RBDVolumeSource", 0),
        12: ("flexVolume", MSG, "core.v1.FlexVolumeSource", 0),
        13: ("cinder", MSG, "core.v1.CinderVolumeSource", 0),
        14: ("cephfs", MSG, "core.v1.CephFSVolumeSource", 0),
        15: ("flocker", MSG, "core.v1.FlockerVolumeSource", 0),
        16: ("downwardAPI", MSG, "core.v1.DownwardAPIVolumeSource", 0),
        17: ("fc", MSG, "core.v1.FCVolumeSource", 0),
        18: ("azureFile", MSG, "core.v1.AzureFileVolumeSource", 0),
        19: ("configMap", MSG, "core.v1.ConfigMapVolumeSource", 0),
        20: ("vsphereVolume", MSG, "core.v1.VsphereVirtualDiskVolumeSource", 0),
        21: ("quobyte", MSG, "core.v1.QuobyteVolumeSource", 0),
        22: ("azureDisk", MSG, "core.v1.AzureDiskVolumeSource", 0),
        23: ("photonPersistentDisk", MSG, "core.v1.PhotonPersistentDiskVolumeSource", 0),
        24: ("portworxVolume", MSG, "core.v1.PortworxVolumeSource", 0),
        25: ("scaleIO", MSG, "core.v1.ScaleIOVolumeSource", 0),
        26: ("projected", MSG, "core.v1.ProjectedVolumeSource", 0),
        27: ("storageos", MSG, "core.v1.StorageOSVolumeSource", 0),
        28: ("csi", MSG, "core.v1.CSIVolumeSource", 0),
        29: ("ephemeral", MSG, "core.v1.EphemeralVolumeSource", 0),
        30: ("image", MSG, "core.v1.ImageVolumeSource", 0),
    },
    "core.v1.VsphereVirtualDiskVolumeSource": {
        1: ("volumePath", STR, None, 0), 2: ("fsType", STR, None, 0),
        3: ("storagePolicyName", STR, None, 0), 4: ("storagePolicyID", STR, None, 0),
    },
    "core.v1.WeightedPodAffinityTerm": {
        1: ("weight", INT, None, 0), 2: ("podAffinityTerm", MSG, "core.v1.PodAffinityTerm", 0),
    },
    "core.v1.WindowsSecurityContextOptions": {
        1: ("gmsaCredentialSpecName", STR, None, PTR), 2: ("gmsaCredentialSpec", STR, None, PTR),
        3: ("runAsUserName", STR, None, PTR), 4: ("hostProcess", BOOL, None, PTR),
    },
    "events.v1.Event": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("eventTime", MICROTIME, None, 0),
        3: ("series", MSG, "events.v1.EventSeries", 0), 4: ("reportingController", STR, None, 0),
        5: ("reportingInstance", STR, None, 0), 6: ("action", STR, None, 0),
        7: ("reason", STR, None, 0), 8: ("regarding", MSG, "core.v1.ObjectReference", 0),
        9: ("related", MSG, "core.v1.ObjectReference", 0), 10: ("note", STR, None, 0),
        11: ("type", STR, None, 0), 12: ("deprecatedSource", MSG, "core.v1.EventSource", 0),
        13: ("deprecatedFirstTimestamp", TIME, None, 0),
        14: ("deprecatedLastTimestamp", TIME, None, 0), 15: ("deprecatedCount", INT, None, 0),
    },
    "events.v1.EventSeries": {
        1: ("count", INT, None, 0), 2: ("lastObservedTime", MICROTIME, None, 0),
    },
    "meta.v1.Condition": {
        1: ("type", STR, None, 0), 2: ("status", STR, None, 0),
        3: ("observedGeneration", INT, None, 0), 4: ("lastTransitionTime", TIME, None, 0),
        5: ("reason", STR, None, 0), 6: ("message", STR, None, 0),
    },
    "meta.v1.DeleteOptions": {
        1: ("gracePeriodSeconds", INT, None, PTR),
        2: ("preconditions", MSG, "meta.v1.Preconditions", 0),
        3: ("orphanDependents", BOOL, None, PTR), 4: ("propagationPolicy", STR, None, PTR),
        5: ("dryRun", STR, None, REP),
        6: ("ignoreStoreReadErrorWithClusterBreakingPotential", BOOL, None, PTR),
    },
    "meta.v1.LabelSelector": {
        1: ("matchLabels", STR, None, MAP),
        2: ("matchExpressions", MSG, "meta.v1.LabelSelectorRequirement", REP),
    },
    "meta.v1.LabelSelectorRequirement": {
        1: ("key", STR, None, 0), 2: ("operator", STR, None, 0), 3: ("values", STR, None, REP),
    },
    "meta.v1.ManagedFieldsEntry": {
        1: ("manager", STR, None, 0), 2: ("operation", STR, None, 0),
        3: ("apiVersion", STR, None, 0), 4: ("time", TIME, None, 0),
        6: ("fieldsType", STR, None, 0), 7: ("fieldsV1", FIELDS, None, 0),
        8: ("subresource", STR, None, 0),
    },
    "meta.v1.ObjectMeta": {
        1: ("name", STR, None, 0), 2: ("generateName", STR, None, 0),
        3: ("namespace", STR, None, 0), 4: ("selfLink", STR, None, 0), 5: ("uid", STR, None, 0),
        6: ("resourceVersion", STR, None, 0), 7: ("generation", INT, None, 0),
        8: ("creationTimestamp", TIME, None, 0), 9: ("deletionTimestamp", TIME, None, 0),
        10: ("deletionGracePeriodSeconds", INT, None, PTR), 11: ("labels", STR, None, MAP),
        12: ("annotations", STR, None, MAP),
        13: ("ownerReferences", MSG, "meta.v1.OwnerReference", REP),
        14: ("finalizers", STR, None, REP),
        17: ("managedFields", MSG, "meta.v1.ManagedFieldsEntry", REP),
    },
    "meta.v1.OwnerReference": {
        1: ("kind", STR, None, 0), 3: ("name", STR, None, 0), 4: ("uid", STR, None, 0),
        5: ("apiVersion", STR, None, 0), 6: ("controller", BOOL, None, PTR),
        7: ("blockOwnerDeletion", BOOL, None, PTR),
    },
    "meta.v1.Preconditions": {
        1: ("uid", STR, None, PTR), 2: ("resourceVersion", STR, None, PTR),
    },
    "scheduling.v1.PriorityClass": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("value", INT, None, 0),
        3: ("globalDefault", BOOL, None, 0), 4: ("description", STR, None, 0),
        5: ("preemptionPolicy", STR, None, PTR),
    },
    "policy.v1.Eviction": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("deleteOptions", MSG, "meta.v1.DeleteOptions", 0),
    },
    # `kubectl create poddisruptionbudget|quota` (and typed clients creating limit ranges).
    "policy.v1.PodDisruptionBudget": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "policy.v1.PodDisruptionBudgetSpec", 0),
        3: ("status", MSG, "policy.v1.PodDisruptionBudgetStatus", 0),
    },
    "policy.v1.PodDisruptionBudgetSpec": {
        1: ("minAvailable", INTSTR, None, 0), 2: ("selector", MSG, "meta.v1.LabelSelector", 0),
        3: ("maxUnavailable", INTSTR, None, 0), 4: ("unhealthyPodEvictionPolicy", STR, None, PTR),
    },
    "policy.v1.PodDisruptionBudgetStatus": {
        1: ("observedGeneration", INT, None, 0), 2: ("disruptedPods", TIME, None, MAP),
        3: ("disruptionsAllowed", INT, None, 0), 4: ("currentHealthy", INT, None, 0),
        5: ("desiredHealthy", INT, None, 0), 6: ("expectedPods", INT, None, 0),
        7: ("conditions", MSG, "meta.v1.Condition", REP),
    },
    "core.v1.ResourceQuota": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.ResourceQuotaSpec", 0),
        3: ("status", MSG, "core.v1.ResourceQuotaStatus", 0),
    },
    "core.v1.ResourceQuotaSpec": {
        1: ("hard", QUANTITY, None, MAP), 2: ("scopes", STR, None, REP),
        3: ("scopeSelector", MSG, "core.v1.ScopeSelector", 0),
    },
    "core.v1.ResourceQuotaStatus": {
        1: ("hard", QUANTITY, None, MAP), 2: ("used", QUANTITY, None, MAP),
    },
    "core.v1.ScopeSelector": {
        1: ("matchExpressions", MSG, "core.v1.ScopedResourceSelectorRequirement", REP),
    },
    "core.v1.ScopedResourceSelectorRequirement": {
        1: ("scopeName", STR, None, 0), 2: ("operator", STR, None, 0), 3: ("values", STR, None, REP),
    },
    "core.v1.LimitRange": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "core.v1.LimitRangeSpec", 0),
    },
    "core.v1.LimitRangeSpec": {
        1: ("limits", MSG, "core.v1.LimitRangeItem", REP),
    },
    "core.v1.LimitRangeItem": {
        1: ("type", STR, None, 0), 2: ("max", QUANTITY, None, MAP), 3: ("min", QUANTITY, None, MAP),
        4: ("default", QUANTITY, None, MAP), 5: ("defaultRequest", QUANTITY, None, MAP),
        6: ("maxLimitRequestRatio", QUANTITY, None, MAP),
    },
    # `kubectl create ingress` (and typed clients writing the other networking.k8s.io/v1 kinds).
    "networking.v1.Ingress": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "networking.v1.IngressSpec", 0),
        3: ("status", MSG, "networking.v1.IngressStatus", 0),
    },
    "networking.v1.IngressSpec": {
        1: ("defaultBackend", MSG, "networking.v1.IngressBackend", 0),
        2: ("tls", MSG, "networking.v1.IngressTLS", REP), 3: ("rules", MSG, "networking.v1.IngressRule", REP),
        4: ("ingressClassName", STR, None, PTR),
    },
    "networking.v1.IngressBackend": {
        3: ("resource", MSG, "core.v1.TypedLocalObjectReference", 0),
        4: ("service", MSG, "networking.v1.IngressServiceBackend", 0),
    },
    "networking.v1.IngressServiceBackend": {
        1: ("name", STR, None, 0), 2: ("port", MSG, "networking.v1.ServiceBackendPort", 0),
    },
    "networking.v1.ServiceBackendPort": {1: ("name", STR, None, 0), 2: ("number", INT, None, 0)},
    "networking.v1.IngressTLS": {1: ("hosts", STR, None, REP), 2: ("secretName", STR, None, 0)},
    "networking.v1.IngressRule": {
        1: ("host", STR, None, 0), 2: ("ingressRuleValue", MSG, "networking.v1.IngressRuleValue", INLINE),
    },
    "networking.v1.IngressRuleValue": {1: ("http", MSG, "networking.v1.HTTPIngressRuleValue", 0)},
    "networking.v1.HTTPIngressRuleValue": {1: ("paths", MSG, "networking.v1.HTTPIngressPath", REP)},
    "networking.v1.HTTPIngressPath": {
        1: ("path", STR, None, 0), 2: ("backend", MSG, "networking.v1.IngressBackend", 0),
        3: ("pathType", STR, None, PTR),
    },
    "networking.v1.IngressStatus": {
        1: ("loadBalancer", MSG, "networking.v1.IngressLoadBalancerStatus", 0),
    },
    "networking.v1.IngressLoadBalancerStatus": {
        1: ("ingress", MSG, "networking.v1.IngressLoadBalancerIngress", REP),
    },
    "networking.v1.IngressLoadBalancerIngress": {
        1: ("ip", STR, None, 0), 2: ("hostname", STR, None, 0),
        4: ("ports", MSG, "networking.v1.IngressPortStatus", REP),
    },
    "networking.v1.IngressPortStatus": {
        1: ("port", INT, None, 0), 2: ("protocol", STR, None, 0), 3: ("error", STR, None, PTR),
    },
    "networking.v1.IngressClass": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "networking.v1.IngressClassSpec", 0),
    },
    "networking.v1.IngressClassSpec": {
        1: ("controller", STR, None, 0),
        2: ("parameters", MSG, "networking.v1.IngressClassParametersReference", 0),
    },
    "networking.v1.IngressClassParametersReference": {
        1: ("apiGroup", STR, None, PTR), 2: ("kind", STR, None, 0), 3: ("name", STR, None, 0),
        4: ("scope", STR, None, PTR), 5: ("namespace", STR, None, PTR),
    },
    "networking.v1.NetworkPolicy": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "networking.v1.NetworkPolicySpec", 0),
    },
    "networking.v1.NetworkPolicySpec": {
        1: ("podSelector", MSG, "meta.v1.LabelSelector", 0),
        2: ("ingress", MSG, "networking.v1.NetworkPolicyIngressRule", REP),
        3: ("egress", MSG, "networking.v1.NetworkPolicyEgressRule", REP), 4: ("policyTypes", STR, None, REP),
    },
    "networking.v1.NetworkPolicyIngressRule": {
        1: ("ports", MSG, "networking.v1.NetworkPolicyPort", REP),
        2: ("from", MSG, "networking.v1.NetworkPolicyPeer", REP),
    },
    "networking.v1.NetworkPolicyEgressRule": {
        1: ("ports", MSG, "networking.v1.NetworkPolicyPort", REP),
        2: ("to", MSG, "networking.v1.NetworkPolicyPeer", REP),
    },
    "networking.v1.NetworkPolicyPort": {
        1: ("protocol", STR, None, PTR), 2: ("port", INTSTR, None, 0), 3: ("endPort", INT, None, PTR),
    },
    "networking.v1.NetworkPolicyPeer": {
        1: ("podSelector", MSG, "meta.v1.LabelSelector", 0),
        2: ("namespaceSelector", MSG, "meta.v1.LabelSelector", 0), 3: ("ipBlock", MSG, "networking.v1.IPBlock", 0),
    },
    "networking.v1.IPBlock": {1: ("cidr", STR, None, 0), 2: ("except", STR, None, REP)},
    # rbac.authorization.k8s.io/v1 (`kubectl create role|clusterrole|rolebinding|clusterrolebinding`).
    "rbac.v1.PolicyRule": {
        1: ("verbs", STR, None, REP), 2: ("apiGroups", STR, None, REP), 3: ("resources", STR, None, REP),
        4: ("resourceNames", STR, None, REP), 5: ("nonResourceURLs", STR, None, REP),
    },
    "rbac.v1.AggregationRule": {1: ("clusterRoleSelectors", MSG, "meta.v1.LabelSelector", REP)},
    "rbac.v1.Role": {1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("rules", MSG, "rbac.v1.PolicyRule", REP)},
    "rbac.v1.ClusterRole": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("rules", MSG, "rbac.v1.PolicyRule", REP),
        3: ("aggregationRule", MSG, "rbac.v1.AggregationRule", 0),
    },
    "rbac.v1.RoleRef": {1: ("apiGroup", STR, None, 0), 2: ("kind", STR, None, 0), 3: ("name", STR, None, 0)},
    "rbac.v1.Subject": {
        1: ("kind", STR, None, 0), 2: ("apiGroup", STR, None, 0), 3: ("name", STR, None, 0),
        4: ("namespace", STR, None, 0),
    },
    "rbac.v1.RoleBinding": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("subjects", MSG, "rbac.v1.Subject", REP),
        3: ("roleRef", MSG, "rbac.v1.RoleRef", 0),
    },
    # authorization.k8s.io/v1 access reviews (`kubectl auth can-i` sends them as protobuf).
    "authorization.v1.SubjectAccessReview": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "authorization.v1.SubjectAccessReviewSpec", 0),
        3: ("status", MSG, "authorization.v1.SubjectAccessReviewStatus", 0),
    },
    "authorization.v1.SelfSubjectAccessReview": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "authorization.v1.SelfSubjectAccessReviewSpec", 0),
        3: ("status", MSG, "authorization.v1.SubjectAccessReviewStatus", 0),
    },
    "authorization.v1.SelfSubjectRulesReview": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "authorization.v1.SelfSubjectRulesReviewSpec", 0),
        3: ("status", MSG, "authorization.v1.SubjectRulesReviewStatus", 0),
    },
    "authorization.v1.SubjectAccessReviewSpec": {
        1: ("resourceAttributes", MSG, "authorization.v1.ResourceAttributes", 0),
        2: ("nonResourceAttributes", MSG, "authorization.v1.NonResourceAttributes", 0),
        3: ("user", STR, None, 0), 4: ("groups", STR, None, REP),
        5: ("extra", STRINGS, None, MAP), 6: ("uid", STR, None, 0),
    },
    "authorization.v1.SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", MSG, "authorization.v1.ResourceAttributes", 0),
        2: ("nonResourceAttributes", MSG, "authorization.v1.NonResourceAttributes", 0),
    },
    "authorization.v1.SelfSubjectRulesReviewSpec": {1: ("namespace", STR, None, 0)},
    "authorization.v1.ResourceAttributes": {
        1: ("namespace", STR, None, 0), 2: ("verb", STR, None, 0), 3: ("group", STR, None, 0),
        4: ("version", STR, None, 0), 5: ("resource", STR, None, 0), 6: ("subresource", STR, None, 0),
        7: ("name", STR, None, 0),
        8: ("fieldSelector", MSG, "authorization.v1.FieldSelectorAttributes", 0),
        9: ("labelSelector", MSG, "authorization.v1.LabelSelectorAttributes", 0),
    },
    "authorization.v1.FieldSelectorAttributes": {
        1: ("rawSelector", STR, None, 0), 2: ("requirements", MSG, "meta.v1.FieldSelectorRequirement", REP),
    },
    "authorization.v1.LabelSelectorAttributes": {
        1: ("rawSelector", STR, None, 0), 2: ("requirements", MSG, "meta.v1.LabelSelectorRequirement", REP),
    },
    "meta.v1.FieldSelectorRequirement": {
        1: ("key", STR, None, 0), 2: ("operator", STR, None, 0), 3: ("values", STR, None, REP),
    },
    "authorization.v1.NonResourceAttributes": {1: ("path", STR, None, 0), 2: ("verb", STR, None, 0)},
    "authorization.v1.SubjectAccessReviewStatus": {
        1: ("allowed", BOOL, None, 0), 4: ("denied", BOOL, None, 0), 2: ("reason", STR, None, 0),
        3: ("evaluationError", STR, None, 0),
    },
    "authorization.v1.SubjectRulesReviewStatus": {
        1: ("resourceRules", MSG, "authorization.v1.ResourceRule", REP),
        2: ("nonResourceRules", MSG, "authorization.v1.NonResourceRule", REP),
        3: ("incomplete", BOOL, None, 0), 4: ("evaluationError", STR, None, 0),
    },
    "authorization.v1.ResourceRule": {
        1: ("verbs", STR, None, REP), 2: ("apiGroups", STR, None, REP), 3: ("resources", STR, None, REP),
        4: ("resourceNames", STR, None, REP),
    },
    "authorization.v1.NonResourceRule": {1: ("verbs", STR, None, REP), 2: ("nonResourceURLs", STR, None, REP)},
    # authentication.k8s.io/v1: what `kubectl create token` and `kubectl auth whoami` send.
    # UserInfo.extra (4, map<string, ExtraValue>) is left out: clients never send it.
    "authentication.v1.BoundObjectReference": {
        1: ("kind", STR, None, 0), 2: ("apiVersion", STR, None, 0), 3: ("name", STR, None, 0),
        4: ("uid", STR, None, 0),
    },
    "authentication.v1.TokenRequest": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "authentication.v1.TokenRequestSpec", 0),
        3: ("status", MSG, "authentication.v1.TokenRequestStatus", 0),
    },
    "authentication.v1.TokenRequestSpec": {
        1: ("audiences", STR, None, REP), 4: ("expirationSeconds", INT, None, PTR),
        3: ("boundObjectRef", MSG, "authentication.v1.BoundObjectReference", 0),
    },
    "authentication.v1.TokenRequestStatus": {1: ("token", STR, None, 0), 2: ("expirationTimestamp", TIME, None, 0)},
    "authentication.v1.TokenReview": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0), 2: ("spec", MSG, "authentication.v1.TokenReviewSpec", 0),
        3: ("status", MSG, "authentication.v1.TokenReviewStatus", 0),
    },
    "authentication.v1.TokenReviewSpec": {1: ("token", STR, None, 0), 2: ("audiences", STR, None, REP)},
    "authentication.v1.TokenReviewStatus": {
        1: ("authenticated", BOOL, None, 0), 2: ("user", MSG, "authentication.v1.UserInfo", 0),
        3: ("error", STR, None, 0), 4: ("audiences", STR, None, REP),
    },
    "authentication.v1.UserInfo": {
        1: ("username", STR, None, 0), 2: ("uid", STR, None, 0), 3: ("groups", STR, None, REP),
    },
    "authentication.v1.SelfSubjectReview": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("status", MSG, "authentication.v1.SelfSubjectReviewStatus", 0),
    },
    "authentication.v1.SelfSubjectReviewStatus": {1: ("userInfo", MSG, "authentication.v1.UserInfo", 0)},
    # certificates.k8s.io/v1 (kubectl certificate approve|deny PUTs the whole object).
    "certificates.v1.CertificateSigningRequest": {
        1: ("metadata", MSG, "meta.v1.ObjectMeta", 0),
        2: ("spec", MSG, "certificates.v1.CertificateSigningRequestSpec", 0),
        3: ("status", MSG, "certificates.v1.CertificateSigningRequestStatus", 0),
    },
    "certificates.v1.CertificateSigningRequestSpec": {
        1: ("request", BYTES, None, 0), 2: ("username", STR, None, 0), 3: ("uid", STR, None, 0),
        4: ("groups", STR, None, REP), 5: ("usages", STR, None, REP), 6: ("extra", STRINGS, None, MAP),
        7: ("signerName", STR, None, 0), 8: ("expirationSeconds", INT, None, PTR),
    },
    "certificates.v1.CertificateSigningRequestStatus": {
        1: ("conditions", MSG, "certificates.v1.CertificateSigningRequestCondition", REP),
        2: ("certificate", BYTES, None, 0),
    },
    "certificates.v1.CertificateSigningRequestCondition": {
        1: ("type", STR, None, 0), 6: ("status", STR, None, 0), 2: ("reason", STR, None, 0),
        3: ("message", STR, None, 0), 4: ("lastUpdateTime", TIME, None, 0),
        5: ("lastTransitionTime", TIME, None, 0),
    },
}

KINDS: Final[dict[tuple[str, str], str]] = {
    ("v1", "Namespace"): "core.v1.Namespace",
    ("v1", "ConfigMap"): "core.v1.ConfigMap",
    ("v1", "Secret"): "core.v1.Secret",
    ("v1", "ServiceAccount"): "core.v1.ServiceAccount",
    ("v1", "Service"): "core.v1.Service",
    ("v1", "Pod"): "core.v1.Pod",
    ("v1", "Node"): "core.v1.Node",
    ("v1", "Endpoints"): "core.v1.Endpoints",
    ("v1", "Event"): "core.v1.Event",
    ("apps/v1", "Deployment"): "apps.v1.Deployment",
    ("apps/v1", "ReplicaSet"): "apps.v1.ReplicaSet",
    ("apps/v1", "StatefulSet"): "apps.v1.StatefulSet",
    ("apps/v1", "DaemonSet"): "apps.v1.DaemonSet",
    ("batch/v1", "Job"): "batch.v1.Job",
    ("batch/v1", "CronJob"): "batch.v1.CronJob",
    ("coordination.k8s.io/v1", "Lease"): "coordination.v1.Lease",
    ("events.k8s.io/v1", "Event"): "events.v1.Event",
    ("scheduling.k8s.io/v1", "PriorityClass"): "scheduling.v1.PriorityClass",
    ("policy/v1", "Eviction"): "policy.v1.Eviction",
    ("policy/v1", "PodDisruptionBudget"): "policy.v1.PodDisruptionBudget",
    ("v1", "ResourceQuota"): "core.v1.ResourceQuota",
    ("v1", "LimitRange"): "core.v1.LimitRange",
    # policy/v1beta1 Eviction has the same fields and numbers (kubectl < 1.22 sends it).
    ("policy/v1beta1", "Eviction"): "policy.v1.Eviction",
    ("autoscaling/v1", "HorizontalPodAutoscaler"): "autoscaling.v1.HorizontalPodAutoscaler",
    ("networking.k8s.io/v1", "Ingress"): "networking.v1.Ingress",
    ("networking.k8s.io/v1", "IngressClass"): "networking.v1.IngressClass",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networking.v1.NetworkPolicy",
    ("v1", "DeleteOptions"): "meta.v1.DeleteOptions",
    ("meta.k8s.io/v1", "DeleteOptions"): "meta.v1.DeleteOptions",
    ("rbac.authorization.k8s.io/v1", "Role"): "rbac.v1.Role",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "rbac.v1.ClusterRole",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rbac.v1.RoleBinding",
    # Same fields and numbers as a RoleBinding.
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "rbac.v1.RoleBinding",
    ("authorization.k8s.io/v1", "SubjectAccessReview"): "authorization.v1.SubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "authorization.v1.SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): "authorization.v1.SubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "authorization.v1.SelfSubjectRulesReview",
    ("authentication.k8s.io/v1", "TokenRequest"): "authentication.v1.TokenRequest",
    ("authentication.k8s.io/v1", "TokenReview"): "authentication.v1.TokenReview",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "authentication.v1.SelfSubjectReview",
    ("certificates.k8s.io/v1", "CertificateSigningRequest"): "certificates.v1.CertificateSigningRequest",
}
