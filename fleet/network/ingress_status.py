"""Pure decisions of the ingress controller's write side: which statuses and events to write.

`fleet.network.routebuild.build` says what every Ingress, GatewayClass, Gateway and
HTTPRoute's status should be and which Events happened; this module decides, with
no I/O, what of that must actually reach the API:

* `desired_status(update, current, controller, now)` — the status to hold, with the
  Kubernetes rule for conditions (metav1.Condition / meta.SetStatusCondition): a
  condition whose `status` did not change keeps its `lastTransitionTime`, a new or
  changed one gets `now`.  An HTTPRoute's `status.parents` keeps the entries other
  controllers own (Gateway API: each controller manages only the entries with its
  `controllerName`).  Equal to the informer's copy → nothing to write, so a pass that
  changes nothing writes nothing.
* `merge_patch(old, new)` — the RFC 7386 merge patch from one status to the other
  (keys that went are sent as null, lists whole), for the status subresource.
* `released(...)` — an Ingress we stopped serving that still shows our addresses gets
  its `status.loadBalancer` emptied.
* `EventDeduper` — an event is recorded when it appears, not at every pass that still
  finds the same problem; once the problem is gone and comes back it is recorded again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleet.network.routetable import RouteEvent, StatusUpdate

#: kind → (plural, cluster-scoped) of the objects the builder reports on.
KINDS: dict[str, tuple[str, bool]] = {
    "Ingress": ("ingresses", False),
    "IngressClass": ("ingressclasses", True),
    "GatewayClass": ("gatewayclasses", True),
    "Gateway": ("gateways", False),
    "HTTPRoute": ("httproutes", False),
}

_CONDITION_LISTS = ("conditions",)


def _carry_conditions(new: Any, old: Any, now: str) -> Any:
    """`new` with every condition list's lastTransitionTime carried over from `old`
    when that condition's status is unchanged (recursing into parents/listeners/...)."""
    if isinstance(new, dict):
        out: dict[str, Any] = {}
        old_d = old if isinstance(old, dict) else {}
        for k, v in new.items():
            if k in _CONDITION_LISTS and isinstance(v, list):
                out[k] = _carry_list(v, old_d.get(k), now)
            else:
                out[k] = _carry_conditions(v, old_d.get(k), now)
        return out
    if isinstance(new, list):
        old_l = old if isinstance(old, list) else []
        # Lists of objects (parents, listeners) pair up by position only when they
        # describe the same thing: match by a stable key where there is one.
        return [_carry_conditions(item, _partner(item, old_l, i), now) for i, item in enumerate(new)]
    return new


def _partner(item: Any, old: list[Any], index: int) -> Any:
    if isinstance(item, dict):
        for key in ("parentRef", "name"):
            if key in item:
                for o in old:
                    if isinstance(o, dict) and o.get(key) == item[key] \
                            and o.get("controllerName") == item.get("controllerName"):
                        return o
                return None
    return old[index] if index < len(old) else None


def _carry_list(conds: list[Any], old: Any, now: str) -> list[Any]:
    prev = {c.get("type"): c for c in old if isinstance(c, dict)} if isinstance(old, list) else {}
    out = []
    for c in conds:
        if not isinstance(c, dict):
            out.append(c)
            continue
        c = dict(c)
        p = prev.get(c.get("type"))
        if p is not None and p.get("status") == c.get("status") and p.get("lastTransitionTime"):
            c["lastTransitionTime"] = p["lastTransitionTime"]
        elif not c.get("lastTransitionTime"):
            c["lastTransitionTime"] = now
        out.append(c)
    return out


def desired_status(update: StatusUpdate, current: dict[str, Any] | None, controller: str,
                   now: str) -> dict[str, Any]:
    """The status `current` (the object as the informer holds it) should get."""
    old = (current or {}).get("status")
    old = old if isinstance(old, dict) else {}
    new = dict(update.status)
    if update.kind == "HTTPRoute" and isinstance(new.get("parents"), list):
        others = [p for p in old.get("parents") or []
                  if isinstance(p, dict) and p.get("controllerName") != controller]
        mine = [p for p in new["parents"] if isinstance(p, dict)]
        new["parents"] = others + mine
    return _carry_conditions(new, old, now)


def current_status(current: dict[str, Any] | None) -> dict[str, Any]:
    st = (current or {}).get("status")
    return st if isinstance(st, dict) else {}


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new` (dicts recursively)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for k in old:
        if k not in new:
            patch[k] = None
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch(old[k], v) if isinstance(v, dict) and isinstance(old[k], dict) else v
    return patch


def pending_writes(updates: Iterable[StatusUpdate], lookup: Any, controller: str, now: str
                   ) -> list[tuple[StatusUpdate, dict[str, Any], dict[str, Any] | None]]:
    """(update, status it should hold, merge patch) for every update whose object exists
    in `lookup(kind, namespace, name)`; the patch is None when the object's status is
    already that."""
    out: list[tuple[StatusUpdate, dict[str, Any], dict[str, Any] | None]] = []
    for u in updates:
        if u.kind not in KINDS:
            continue
        cur = lookup(u.kind, u.namespace, u.name)
        if cur is None:
            continue  # gone (or not listed yet): nothing to write to
        want = desired_status(u, cur, controller, now)
        have = current_status(cur)
        out.append((u, want, merge_patch(have, want) if want != have else None))
    return out


def released(ingresses: Iterable[dict[str, Any]], statuses: Iterable[StatusUpdate],
             ours: dict[str, Any]) -> list[StatusUpdate]:
    """Ingresses we no longer serve (their class changed, our class went) that still
    show our addresses: their `status.loadBalancer` is emptied, as ingress-nginx does
    for an Ingress it stops serving, so `kubectl get ing` stops pointing at us."""
    served = {(u.namespace, u.name) for u in statuses if u.kind == "Ingress"}
    out = []
    for ing in ingresses:
        md = ing.get("metadata") or {}
        key = (str(md.get("namespace") or ""), str(md.get("name") or ""))
        lb = (ing.get("status") or {}).get("loadBalancer") if isinstance(ing.get("status"), dict) else None
        if key in served or not lb or not lb.get("ingress") or lb != ours.get("loadBalancer"):
            continue
        out.append(StatusUpdate("networking.k8s.io/v1", "Ingress", key[0], key[1], {"loadBalancer": {}}))
    return out


class EventDeduper:
    """Which of a pass's events are new: not reported by the previous pass."""

    def __init__(self) -> None:
        self.active: set[RouteEvent] = set()

    def new(self, events: Iterable[RouteEvent]) -> list[RouteEvent]:
        events = list(dict.fromkeys(events))  # order kept, duplicates within a pass gone
        fresh = [e for e in events if e not in self.active]
        self.active = set(events)
        return fresh


__all__ = ["KINDS", "EventDeduper", "current_status", "desired_status", "merge_patch", "pending_writes",
           "released"]
