"""Events, served as `v1` Event and as `events.k8s.io/v1` Event.

The two are the same concept with renamed fields (`involvedObject` vs
`regarding`, `message` vs `note`, `source.component` vs
`reportingController`, `count` vs `series.count`/`deprecatedCount`).
kube-apiserver prints both with one printer after converting to the core
shape; `core_view` does that conversion for the table here.  For now each
version has its own storage (`storage_group=None` on the events.k8s.io one).
"""

from __future__ import annotations

from typing import Any

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.kinds._common import col, d, num, since
from fleet.api.registry import KindInfo

Cause = dict[str, str]

EVENT_TYPES = ("Normal", "Warning")
# events.k8s.io limits (k8s.io/kubernetes/pkg/apis/core/validation/events.go).
REPORTING_INSTANCE_MAX = 128
ACTION_MAX = 128
REASON_MAX = 128
NOTE_MAX = 1024


def core_view(o: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event in v1 Event's shape (v1 Events pass through)."""
    if "regarding" not in o and "note" not in o and "reportingController" not in o:
        return o
    src = d(o, "deprecatedSource")
    return {
        "metadata": d(o, "metadata"),
        "involvedObject": d(o, "regarding"),
        "reason": o.get("reason", ""),
        "message": o.get("note", ""),
        "type": o.get("type", ""),
        "source": src,
        "reportingComponent": o.get("reportingController", ""),
        "reportingInstance": o.get("reportingInstance", ""),
        "firstTimestamp": o.get("deprecatedFirstTimestamp"),
        "lastTimestamp": o.get("deprecatedLastTimestamp"),
        "count": o.get("deprecatedCount"),
        "eventTime": o.get("eventTime"),
        "series": o.get("series"),
    }


def _first_seen(e: dict[str, Any]) -> str:
    return since(e.get("firstTimestamp") or e.get("eventTime"))


def _last_seen(e: dict[str, Any]) -> str:
    series = e.get("series")
    if isinstance(series, dict):
        return since(series.get("lastObservedTime"))
    if e.get("lastTimestamp"):
        return since(e["lastTimestamp"])
    return _first_seen(e)


def _count(e: dict[str, Any]) -> int:
    series = e.get("series")
    if isinstance(series, dict):
        return num(series.get("count"))
    # Singleton events written through events.k8s.io carry no count at all.
    return num(e.get("count")) or 1


def _object(e: dict[str, Any]) -> str:
    inv = d(e, "involvedObject")
    kind = str(inv.get("kind", "")).lower()
    return f"{kind}/{inv['name']}" if inv.get("name") else kind


def _source(e: dict[str, Any]) -> str:
    src = d(e, "source")
    component = src.get("component") or e.get("reportingComponent") or ""
    host = src.get("host") or e.get("reportingInstance") or ""
    return f"{component}, {host}" if host else component


def _view(fn):
    return lambda o: fn(core_view(o))


EVENT_COLUMNS = (
    col("Last Seen", _view(_last_seen), description="The time at which the most recent occurrence of this event was recorded."),
    col("Type", _view(lambda e: e.get("type", "")), description="Type of this event (Normal, Warning), new types could be added in the future"),
    col("Reason", _view(lambda e: e.get("reason", "")), description="This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
    col("Object", _view(_object), description="The object that this event is about."),
    col("Subobject", _view(lambda e: d(e, "involvedObject").get("fieldPath", "")), priority=1,
        description="If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement."),
    col("Source", _view(_source), priority=1, description="The component reporting this event."),
    col("Message", _view(lambda e: str(e.get("message") or "").strip()), description="A human-readable description of the status of this operation."),
    col("First Seen", _view(_first_seen), priority=1, description="The time at which the event was first recorded."),
    col("Count", _view(_count), priority=1, description="The number of times this event has occurred."),
    col("Name", lambda o: d(o, "metadata").get("name", ""), priority=1,
        description="Name must be unique within a namespace."),
)


def _valid_time(val: Any) -> bool:
    if not isinstance(val, str):
        return False
    try:
        meta.parse_rfc3339(val)
    except ValueError:
        return False
    return True


def _check_namespace(obj: dict[str, Any], ref_key: str, out: list[Cause]) -> None:
    ns = d(obj, "metadata").get("namespace")
    ref_ns = d(obj, ref_key).get("namespace")
    # Events about namespaced objects live in the object's namespace; events
    # about cluster-scoped objects (nodes) may live in any namespace.
    if ref_ns and ns and ref_ns != ns:
        out.append(v.invalid(f"{ref_key}.namespace", ref_ns, "does not match event.namespace"))


def validate_core_event(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    inv = obj.get("involvedObject")
    if inv is not None and not isinstance(inv, dict):
        out.append(v.type_invalid("involvedObject", inv, "object"))
    _check_namespace(obj, "involvedObject", out)
    count = obj.get("count")
    if count is not None and v.as_int(count) is None:
        out.append(v.type_invalid("count", count, "integer"))
    for key in ("firstTimestamp", "lastTimestamp", "eventTime"):
        val = obj.get(key)
        if val is not None and not _valid_time(val):
            out.append(v.invalid(key, val, "must be an RFC 3339 timestamp"))
    return out


def validate_events_event(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """events.k8s.io/v1 is strict: who reported what, when, and why are all required."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    _check_namespace(obj, "regarding", out)
    if not obj.get("eventTime"):
        out.append(v.required("eventTime"))
    elif not _valid_time(obj["eventTime"]):
        out.append(v.invalid("eventTime", obj["eventTime"], "must be an RFC 3339 timestamp"))
    etype = obj.get("type")
    if etype not in EVENT_TYPES:
        out.append(v.not_supported("type", etype if etype is not None else "", EVENT_TYPES))
    rc = obj.get("reportingController")
    if not rc:
        out.append(v.required("reportingController"))
    else:
        for msg in v.is_qualified_name(str(rc)):
            out.append(v.invalid("reportingController", rc, msg))
    for key, limit in (("reportingInstance", REPORTING_INSTANCE_MAX), ("action", ACTION_MAX),
                       ("reason", REASON_MAX)):
        val = obj.get(key)
        if not val:
            out.append(v.required(key))
        elif not isinstance(val, str):
            out.append(v.type_invalid(key, val, "string"))
        elif len(val) > limit:
            out.append(v.too_long(key, limit))
    note = obj.get("note")
    if isinstance(note, str) and len(note.encode()) > NOTE_MAX:
        out.append(v.too_long("note", NOTE_MAX))
    return out


CORE_EVENT = KindInfo(
    group="", version="v1", kind="Event", plural="events", singular="event",
    short_names=("ev",),
    columns_override=EVENT_COLUMNS,
    validate=validate_core_event,
    selectable_fields=(
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
    ),
)

EVENTS_EVENT = KindInfo(
    group="events.k8s.io", version="v1", kind="Event", plural="events", singular="event",
    short_names=("ev",),
    columns_override=EVENT_COLUMNS,
    validate=validate_events_event,
    selectable_fields=(
        "regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
        "regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath",
        "reason", "reportingController", "type",
    ),
    storage_group=None,
)

KINDS = (CORE_EVENT, EVENTS_EVENT)
