"""NodeUnschedulable: cordoned nodes (`spec.unschedulable: true`) take no new pods.

Pods that tolerate the `node.kubernetes.io/unschedulable:NoSchedule` taint
(DaemonSet pods do) are the exception, as in Kubernetes.
"""

from __future__ import annotations

from typing import Any

from fleet.api.tolerations import tolerates
from fleet.scheduler.framework import CycleState, Status
from fleet.scheduler.snapshot import NodeInfo

ERR_REASON = "node(s) were unschedulable"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


class NodeUnschedulable:
    name = "NodeUnschedulable"

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        if not node.unschedulable:
            return Status.success()
        if tolerates((pod.get("spec") or {}).get("tolerations") or [], UNSCHEDULABLE_TAINT):
            return Status.success()
        return Status.unschedulable(ERR_REASON, unresolvable=True)
