"""TaintToleration: a node's NoSchedule/NoExecute taints keep off pods that do not tolerate them.

PreferNoSchedule is a scoring matter and comes with the full framework; here
only the hard effects filter.  `tolerates` is shared with NodeUnschedulable,
because a cordoned node is "tainted" `node.kubernetes.io/unschedulable:NoSchedule`
for the purpose of tolerations (DaemonSet pods tolerate it).
"""

from __future__ import annotations

from typing import Any

from fleet.scheduler.framework import CycleState, Status
from fleet.scheduler.snapshot import NodeInfo

HARD_EFFECTS = ("NoSchedule", "NoExecute")


def toleration_matches(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def tolerates(tolerations: list[Any], taint: dict[str, Any]) -> bool:
    return any(isinstance(t, dict) and toleration_matches(t, taint) for t in tolerations)


def untolerated_reason(taint: dict[str, Any]) -> str:
    return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"


class TaintToleration:
    name = "TaintToleration"

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        for taint in (node.node.get("spec") or {}).get("taints") or []:
            if not isinstance(taint, dict) or taint.get("effect") not in HARD_EFFECTS:
                continue
            if not tolerates(tolerations, taint):
                return Status.unschedulable(untolerated_reason(taint), unresolvable=True)
        return Status.success()
