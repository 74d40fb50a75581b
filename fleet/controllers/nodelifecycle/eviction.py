"""Taint-based eviction decisions (the NoExecute taint manager's arithmetic).

`eviction_deadline` says when a pod with given tolerations must leave a node with
given NoExecute taints (at once, never, or a wall-clock time counted from each
taint's `timeAdded`); `pod_not_ready_patch` is MarkPodsNotReady's status patch.  Pure:
the controller schedules and performs the deletions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet.api.tolerations import toleration_matches
from fleet.controllers.nodelifecycle.common import (
    EVICT_NOW,
    NO_EXECUTE,
    _rv,
    get_condition,
)


def eviction_deadline(tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]],
                      since: Callable[[Mapping[str, Any]], float]) -> float | None:
    """When a pod with `tolerations` must leave a node with NoExecute `taints`.

    Returns EVICT_NOW if some taint is not tolerated, None if every taint is
    tolerated forever, else the wall-clock time: for each taint, the first
    matching toleration's `tolerationSeconds` (<= 0 meaning at once, absent
    meaning forever) counted from `since(taint)`; the earliest wins.  "First
    matching" is Kubernetes' GetMatchingTolerations.
    """
    tols = [dict(t) for t in tolerations]
    deadline: float | None = None
    for taint in taints:
        if taint.get("effect") != NO_EXECUTE:
            continue
        used = next((t for t in tols if toleration_matches(t, dict(taint))), None)
        if used is None:
            return EVICT_NOW
        secs = used.get("tolerationSeconds")
        if isinstance(secs, bool) or not isinstance(secs, int | float):
            continue  # tolerated forever
        at = since(taint) + max(float(secs), 0.0)
        deadline = at if deadline is None else min(deadline, at)
    return deadline


def pod_not_ready_patch(pod: Mapping[str, Any], stamp: str) -> dict[str, Any] | None:
    """MarkPodsNotReady: Ready=False for a pod whose Ready condition is not False already.

    A pod without a Ready condition is left alone, as in Kubernetes.  The
    patch carries the pod's resourceVersion, so it never overwrites a status
    the node wrote after we looked.
    """
    c = get_condition(pod, "Ready")
    if c is None or c.get("status") == "False":
        return None
    return {"metadata": {"resourceVersion": _rv(pod)},
            "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": stamp}]}}

