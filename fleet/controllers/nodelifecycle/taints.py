"""Taints from conditions: TaintNodesByCondition's NoSchedule taints, and the NoExecute
taint the health judgment calls for.

`plan_taints` computes a node's new `spec.taints`: managed NoSchedule taints follow the
conditions; the controller's NoExecute taint is removed or swapped at once but *added*
only through the rate-limited per-zone queue (the controller's tainter), as in
Kubernetes.  Taints owned by anyone else are kept as they are.  Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.controllers.nodelifecycle.common import (
    CONDITION_TAINTS,
    CONTROLLER_NO_EXECUTE,
    MANAGED_NO_SCHEDULE,
    NO_EXECUTE,
    NO_SCHEDULE,
    TAINT_UNSCHEDULABLE,
    node_taints,
)


def condition_taint_keys(node: Mapping[str, Any]) -> list[str]:
    """The NoSchedule taints the node's conditions and spec.unschedulable call for (TaintNodesByCondition)."""
    keys: list[str] = []
    for c in (node.get("status") or {}).get("conditions") or []:
        if not isinstance(c, dict):
            continue
        key = CONDITION_TAINTS.get(str(c.get("type")), {}).get(str(c.get("status")))
        if key and key not in keys:
            keys.append(key)
    if (node.get("spec") or {}).get("unschedulable") is True:
        keys.append(TAINT_UNSCHEDULABLE)
    return keys


@dataclass(frozen=True)
class TaintPlan:
    taints: list[dict[str, Any]] | None  # the node's new spec.taints, or None if unchanged
    queue_no_execute: bool  # the NoExecute taint must be added through the rate-limited queue


def plan_taints(node: Mapping[str, Any], target: str | None, stamp: str, *,
                reset: bool = False) -> TaintPlan:
    """The node's taints after TaintNodesByCondition and the NoExecute decision.

    `node` carries the conditions as they will be after this pass.  Taints
    someone else owns are kept as they are, in order.  The NoExecute taint is
    *removed* at once, *swapped* (unreachable ↔ not-ready) at once, but
    *added* only through the rate-limited queue, as in Kubernetes.  `reset`
    drops our NoExecute taints left from before the controller started
    (Kubernetes' markNodeAsReachable for newly seen nodes): they are re-added,
    with a fresh timeAdded, only once the node is judged again.
    """
    current = node_taints(node)
    wanted_ns = condition_taint_keys(node)
    out: list[dict[str, Any]] = []
    have_ns: set[str] = set()
    for t in current:
        key, effect = t.get("key"), t.get("effect")
        if effect == NO_SCHEDULE and key in MANAGED_NO_SCHEDULE:
            if key in wanted_ns and key not in have_ns:
                out.append(t)
                have_ns.add(str(key))
            continue
        if effect == NO_EXECUTE and key in CONTROLLER_NO_EXECUTE:
            continue  # decided below
        out.append(t)
    out.extend({"key": k, "effect": NO_SCHEDULE} for k in wanted_ns if k not in have_ns)

    present = [t for t in current if t.get("effect") == NO_EXECUTE and t.get("key") in CONTROLLER_NO_EXECUTE]
    if reset:
        present = []
    queue = False
    if target is not None:
        if present and all(t.get("key") == target for t in present):
            out.append(present[0])  # already right: keep its timeAdded
        elif present:
            out.append({"key": target, "effect": NO_EXECUTE, "timeAdded": stamp})  # swap at once
        else:
            queue = True
    return TaintPlan(taints=None if out == current else out, queue_no_execute=queue)


def with_no_execute(node: Mapping[str, Any], target: str, stamp: str) -> list[dict[str, Any]] | None:
    """The node's taints with `target` as the only controller NoExecute taint (None if so already)."""
    current = node_taints(node)
    out = [t for t in current if not (t.get("effect") == NO_EXECUTE and t.get("key") in CONTROLLER_NO_EXECUTE)]
    kept = [t for t in current if t.get("effect") == NO_EXECUTE and t.get("key") == target]
    out.append(kept[0] if kept else {"key": target, "effect": NO_EXECUTE, "timeAdded": stamp})
    return None if out == current else out

