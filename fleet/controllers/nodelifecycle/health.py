"""Node health: when did we last see a sign of life, and what follows from silence.

Liveness is judged by *observation time* (`trio.current_time()` when a heartbeat — a
Lease renewal or a new Ready.lastHeartbeatTime — was seen), never by comparing the
node's own timestamps with our clock.  `plan_node` turns that into the monitor's
judgment of one node: its conditions set to Unknown when silent, and which controller
NoExecute taint (unreachable / not-ready) it should carry.  Pure: no I/O, no clock
reads (times are arguments), tested table-driven.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleet.controllers.nodelifecycle.common import (
    KUBELET_CONDITIONS,
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    NodeLifecycleConfig,
    get_condition,
    ready_status,
)


@dataclass
class NodeHealth:
    """What the controller remembers about a node between passes.

    `probe` is *our* (trio, monotonic) time of the last heartbeat we saw —
    a change of the Lease's renewTime or of Ready's lastHeartbeatTime — never
    the node's own timestamp.
    """

    probe: float
    heartbeat: str | None = None  # Ready.lastHeartbeatTime as last seen
    renew: str | None = None  # Lease spec.renewTime as last seen
    stale: bool = False  # the last monitor pass judged the node silent
    judged: bool = False  # the monitor has passed judgment once (start-up reset done)


def _heartbeat(node: Mapping[str, Any]) -> str | None:
    c = get_condition(node, "Ready")
    hb = c.get("lastHeartbeatTime") if c is not None else None
    return str(hb) if hb else None


def observe_node(health: NodeHealth | None, node: Mapping[str, Any], now: float, *,
                 renew: str | None = None) -> NodeHealth:
    """The node's health after seeing `node` at `now` (k8s tryUpdateNodeHealth's bookkeeping).

    The first sighting counts as a heartbeat: that is what gives every node one
    grace period after the controller starts.  `renew` is the node's Lease
    renewTime if the Lease was seen before the node.
    """
    hb = _heartbeat(node)
    if health is None:
        return NodeHealth(probe=now, heartbeat=hb, renew=renew)
    if hb is not None and hb != health.heartbeat:
        return replace(health, probe=now, heartbeat=hb)
    return health


def observe_lease(health: NodeHealth, renew_time: str | None, now: float) -> NodeHealth:
    """A Lease renewal is a heartbeat.  Any *change* counts (not only a later
    time), so a node whose clock stepped back is not declared dead for it."""
    if renew_time and renew_time != health.renew:
        return replace(health, probe=now, renew=renew_time)
    return health


def grace_period(node: Mapping[str, Any], cfg: NodeLifecycleConfig) -> float:
    """A node that never posted Ready is still starting: it gets the startup grace."""
    return cfg.monitor_grace_period if get_condition(node, "Ready") is not None else cfg.startup_grace_period


def is_stale(health: NodeHealth, node: Mapping[str, Any], now: float, cfg: NodeLifecycleConfig) -> bool:
    return now - health.probe >= grace_period(node, cfg)


def unknown_conditions(node: Mapping[str, Any], stamp: str) -> list[dict[str, Any]] | None:
    """The node's conditions with the kubelet's ones set to Unknown; None if already so.

    Kubernetes' wording and reasons: NodeStatusUnknown / "Kubelet stopped
    posting node status." for a condition the node had, NodeStatusNeverUpdated
    for one it never posted (with lastHeartbeatTime = the node's creation).
    """
    conds = copy.deepcopy([c for c in (node.get("status") or {}).get("conditions") or []
                           if isinstance(c, dict)])
    by_type = {c.get("type"): c for c in conds}
    changed = False
    for ctype in KUBELET_CONDITIONS:
        c = by_type.get(ctype)
        if c is None:
            conds.append({"type": ctype, "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                          "message": "Kubelet never posted node status.",
                          "lastHeartbeatTime": (node.get("metadata") or {}).get("creationTimestamp"),
                          "lastTransitionTime": stamp})
            changed = True
        elif c.get("status") != "Unknown":
            c.update({"status": "Unknown", "reason": "NodeStatusUnknown",
                      "message": "Kubelet stopped posting node status.", "lastTransitionTime": stamp})
            changed = True
    return conds if changed else None


@dataclass(frozen=True)
class NodePlan:
    """The monitor's judgment of one node at one instant."""

    stale: bool
    ready: str | None  # Ready's status after the judgment ("Unknown" when stale)
    conditions: list[dict[str, Any]] | None  # new conditions to write, or None
    no_execute: str | None  # the controller NoExecute taint the node should carry, if any


def plan_node(node: Mapping[str, Any], health: NodeHealth, now: float, stamp: str,
              cfg: NodeLifecycleConfig, *, all_disrupted: bool = False) -> NodePlan:
    """Judge one node: silent for its grace period → Unknown and unreachable;
    reporting Ready=False → not-ready; otherwise no NoExecute taint.  While
    every zone is fully disrupted no NoExecute taint is wanted anywhere."""
    stale = is_stale(health, node, now, cfg)
    conditions = unknown_conditions(node, stamp) if stale else None
    ready = "Unknown" if stale else ready_status(node)
    if all_disrupted:
        target = None
    elif stale:
        target = TAINT_UNREACHABLE
    elif ready == "False":
        target = TAINT_NOT_READY
    else:
        target = None
    return NodePlan(stale=stale, ready=ready, conditions=conditions, no_execute=target)

