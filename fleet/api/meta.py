"""Small helpers over object metadata: timestamps, ages, store keys, dotted paths."""

from __future__ import annotations

import datetime as _dt
from typing import Any


def utcnow() -> _dt.datetime:
    """The wall clock for ages and timestamps (one place, so tests can pin it)."""
    return _dt.datetime.now(_dt.UTC)


def now_rfc3339() -> str:
    """UTC now with second precision, as Kubernetes writes metav1.Time."""
    return utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(s: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def format_time(t: _dt.datetime | float | None = None) -> str:
    """metav1.Time: UTC, second precision.  `t` is a datetime (a naive one is taken as
    UTC), seconds since the epoch, or None for now."""
    if t is None:
        t = utcnow()
    elif isinstance(t, int | float):
        t = _dt.datetime.fromtimestamp(t, _dt.UTC)
    t = t.replace(tzinfo=_dt.UTC) if t.tzinfo is None else t.astimezone(_dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> _dt.datetime | None:
    """An RFC 3339 timestamp as an aware datetime (UTC when it names no zone);
    None when absent or not a timestamp — objects may carry garbage."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = parse_rfc3339(value)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.UTC)


def parse_epoch(value: Any) -> float | None:
    """An RFC 3339 timestamp as seconds since the epoch (None when absent or bad)."""
    t = parse_time(value)
    return t.timestamp() if t is not None else None


def human_duration(seconds: float) -> str:
    """kubectl's `duration.HumanDuration` (the AGE column)."""
    s = int(seconds)
    if s < 0:
        s = 0
    if s < 60 * 2:
        return f"{s}s"
    m = s // 60
    if m < 10:
        rem = s % 60
        return f"{m}m{rem}s" if rem else f"{m}m"
    if m < 60 * 3:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        rm = m % 60
        return f"{h}h{rm}m" if rm else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        rh = h % 24
        return f"{h // 24}d{rh}h" if rh else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        d = (h // 24) % 365
        return f"{h // 24 // 365}y{d}d" if d else f"{h // 24 // 365}y"
    return f"{h // 24 // 365}y"


def age(obj: dict[str, Any]) -> str:
    ts = obj.get("metadata", {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    delta = utcnow() - parse_rfc3339(ts)
    return human_duration(delta.total_seconds())


def get_path(obj: Any, path: str, default: Any = None) -> Any:
    """Follow a dotted path (`spec.template.spec.nodeName`) through dicts."""
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = obj
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def store_key(group: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    """Store key `/{group or core}/{plural}/{namespace}/{name}`.

    With `name=None` the result is a prefix ending in `/` that selects every
    object of the kind (in the namespace, when one is given).
    """
    g = group or "core"
    parts = ["", g, plural]
    if namespace:
        parts.append(namespace)
    if name is None:
        return "/".join(parts) + "/"
    parts.append(name)
    return "/".join(parts)


def _string_map(value: Any) -> bool:
    return value is None or (isinstance(value, dict)
                             and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()))


def malformed(obj: Any) -> str | None:
    """Why `obj` lacks the shape every API object has, or None if it has it.

    Only the envelope shared by all kinds is checked (what typed validation
    guarantees for new writes; objects stored before it may lack it); what a kind's spec holds is
    its handlers' business (and their exceptions are caught per event)."""
    if not isinstance(obj, dict):
        return f"the object is a {type(obj).__name__}"
    md = obj.get("metadata")
    if not isinstance(md, dict):
        return f"metadata is a {type(md).__name__}"
    if not isinstance(md.get("name"), str) or not md["name"]:
        return "metadata.name is not a string"
    if not isinstance(md.get("namespace") or "", str):
        return "metadata.namespace is not a string"
    for field in ("labels", "annotations"):
        if not _string_map(md.get(field)):
            return f"metadata.{field} is not a map of strings"
    if not isinstance(md.get("ownerReferences") or [], list):
        return "metadata.ownerReferences is not a list"
    for field in ("spec", "status"):
        if field in obj and not isinstance(obj[field], dict | None):
            return f"{field} is a {type(obj[field]).__name__}"
    return None
