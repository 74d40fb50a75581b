"""What the route builder's parts share: defensive field access, object ordering,
route precedence keys, conditions and the event/status collector.

The builder reads plain Kubernetes dicts as informers hold them and must never
raise on anything the API server accepts, so every read here tolerates a missing
or oddly typed field.  The precedence key is the one place the Gateway API's match
ordering (which also gives Ingress' "Exact before Prefix, longer first") is spelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fleet.api.conditions import set_status_condition
from fleet.network.proxy_objects import object_meta
from fleet.network.routetable import Match, Route, RouteEvent, StatusUpdate

__all__ = [
    "Collector", "RouteEntry", "age_key", "dicts", "get", "int_or_none", "name_of",
    "namespace_of", "object_meta", "precedence_key", "set_conditions", "text",
]


def get(obj: Any, *path: str) -> Any:
    """obj[path[0]][path[1]]…, or None as soon as a step is not a mapping or is absent."""
    cur = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def dicts(value: Any) -> list[Mapping[str, Any]]:
    """The mapping entries of a list (anything else: [])."""
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, list) else []


def text(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def name_of(obj: Mapping[str, Any]) -> str:
    return text(object_meta(obj).get("name"))


def namespace_of(obj: Mapping[str, Any]) -> str:
    return text(object_meta(obj).get("namespace")) or "default"


def age_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """Oldest first, then namespace/name: the tie-break both APIs use.  RFC 3339
    timestamps in UTC ("…Z", as the API server writes them) sort as strings; an
    object without one sorts after every dated object."""
    ts = text(object_meta(obj).get("creationTimestamp")) or "~"
    return ts, namespace_of(obj), name_of(obj)


_PATH_RANK = {"Exact": 0, "RegularExpression": 1, "Prefix": 2}


def precedence_key(match: Match, source_age: tuple[str, str, str], kind: str,
                   rule_index: int, match_index: int, *, tier: int = 0) -> tuple:
    """Sort key of one (single-match) route among all routes of a host: Gateway API's
    order — Exact path; the longest Prefix; a method match; most header matches; most
    query matches; then the oldest object, namespace/name, and rule order.

    A RegularExpression path (whose precedence the spec leaves to implementations)
    ranks after Exact and before every Prefix, longer patterns first, as Envoy-based
    gateways do.  A Prefix's length ignores a trailing slash ("/foo/" ≡ "/foo").
    `tier` 1 puts a route after every tier-0 one (an Ingress defaultBackend)."""
    p = match.path
    length = len(p.value.rstrip("/")) if p.type == "Prefix" else len(p.value)
    return (tier, _PATH_RANK.get(p.type, 2), -length, 0 if match.method else 1,
            -len(match.headers), -len(match.query), source_age, kind, rule_index, match_index)


@dataclass(frozen=True)
class RouteEntry:
    """One single-match route on its way into a listener's virtual host."""

    port: int
    protocol: Literal["HTTP", "HTTPS"]
    hostname: str
    one_label: bool  # an Ingress wildcard: matches exactly one label
    key: tuple
    route: Route


def set_conditions(existing: Any, wanted: Sequence[tuple[str, str, str, str]], now: str,
                   observed_generation: int | None) -> list[dict[str, Any]]:
    """`wanted` (type, status, reason, message) merged into a copy of `existing`
    (meta.SetStatusCondition each): a lastTransitionTime moves only when its status
    changes, and conditions of other types (another controller's) keep their place,
    as the Gateway API asks of implementations."""
    out = [dict(c) for c in existing if isinstance(c, dict)] if isinstance(existing, list) else []
    for ctype, status, reason, message in wanted:
        out = set_status_condition(out, ctype, status, reason, message, now,
                                   observed_generation=observed_generation)
    return out


@dataclass
class Collector:
    """Events and statuses gathered during one build (deduplicated, sorted at the end)."""

    events: set[RouteEvent] = field(default_factory=set)
    statuses: dict[tuple[str, str, str], StatusUpdate] = field(default_factory=dict)

    def warn(self, kind: str, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.events.add(RouteEvent(kind, namespace_of(obj), name_of(obj), "Warning", reason, message))

    def status(self, api_version: str, kind: str, namespace: str, name: str, status: dict) -> None:
        self.statuses[(kind, namespace, name)] = StatusUpdate(api_version, kind, namespace, name, status)

    def sorted_events(self) -> tuple[RouteEvent, ...]:
        return tuple(sorted(self.events, key=lambda e: (e.kind, e.namespace, e.name, e.reason, e.message)))

    def sorted_statuses(self) -> tuple[StatusUpdate, ...]:
        return tuple(self.statuses[k] for k in sorted(self.statuses))
