"""Status conditions: the one place that reads and sets `status.conditions` entries.

Kubernetes keeps these in apimachinery (`meta.FindStatusCondition`,
`meta.SetStatusCondition`, `meta.IsStatusConditionTrue`) and in
`podutil.GetPodReadyCondition`; controllers, the scheduler's helpers, node lifecycle
and table printers all read conditions, and they used to do it with a private loop
each.  Everything here is pure and tolerant of stored objects whose `status` or
`conditions` are not the expected shape (a non-list or non-dict entry is skipped,
never raised on): reading a condition must never be what stops a controller.

Controller-specific *setting* rules that Kubernetes itself keeps per controller
(SetDeploymentCondition's "same status and reason is a no-op", the Job controller's
"a False condition is never added") stay beside those controllers and read through
`find` here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "condition_status", "find", "get_condition", "is_true", "pod_ready_condition", "is_pod_ready",
    "set_status_condition",
]


def find(conditions: Any, ctype: str) -> dict[str, Any] | None:
    """The first condition of type `ctype` in a conditions list (None when absent)."""
    if not isinstance(conditions, Iterable) or isinstance(conditions, (str, bytes, Mapping)):
        return None
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def condition_status(conditions: Any, ctype: str) -> str | None:
    """The status ("True", "False", "Unknown") of condition `ctype` in a list, None when absent."""
    c = find(conditions, ctype)
    status = c.get("status") if c is not None else None
    return status if isinstance(status, str) else None


def get_condition(obj: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    """The condition `ctype` of an object's `status.conditions`."""
    status = obj.get("status") if isinstance(obj, Mapping) else None
    return find(status.get("conditions") if isinstance(status, Mapping) else None, ctype)


def is_true(obj: Mapping[str, Any], ctype: str) -> bool:
    """Whether the object's condition `ctype` has status "True" (meta.IsStatusConditionTrue)."""
    c = get_condition(obj, ctype)
    return c is not None and c.get("status") == "True"


def pod_ready_condition(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's Ready condition (podutil.GetPodReadyCondition)."""
    return get_condition(pod, "Ready")


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    """podutil.IsPodReady: the Ready condition is True."""
    return is_true(pod, "Ready")


def set_status_condition(conditions: Any, ctype: str, status: str, reason: str, message: str,
                         now: str, *, observed_generation: int | None = None) -> list[dict[str, Any]]:
    """meta.SetStatusCondition on a copy: `conditions` with `ctype` set.

    lastTransitionTime moves only when the status changes (a new condition gets `now`);
    reason, message and observedGeneration (when given) always take the new values.
    The input list and its entries are not modified.
    """
    out = [dict(c) for c in conditions if isinstance(c, dict)] \
        if isinstance(conditions, list) else []
    for c in out:
        if c.get("type") == ctype:
            if c.get("status") != status:
                c["lastTransitionTime"] = now
            c.update(status=status, reason=reason, message=message)
            if observed_generation is not None:
                c["observedGeneration"] = observed_generation
            return out
    new: dict[str, Any] = {"type": ctype, "status": status}
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    new.update(lastTransitionTime=now, reason=reason, message=message)
    out.append(new)
    return out
