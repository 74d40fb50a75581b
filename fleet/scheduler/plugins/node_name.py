"""NodeName: a pod that names its node runs only there.

The scheduler normally never sees such pods (they are bound at creation),
but a pod can carry `spec.nodeName` in a profile that still schedules it
(preemption checks, simulation), so the check lives in the filter chain as in
kube-scheduler.  Pods without a node name skip the filter for the whole
cycle, which saves a call per node for the common case.
"""

from __future__ import annotations

from typing import Any

from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.snapshot import NodeInfo

ERR_REASON = "node(s) didn't match the requested node name"


class NodeName:
    name = "NodeName"

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        return Status.success() if (pod.get("spec") or {}).get("nodeName") else Status(Code.SKIP)

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        wanted = (pod.get("spec") or {}).get("nodeName")
        if wanted and wanted != node.name:
            # Unresolvable: evicting pods elsewhere cannot change a node's name.
            return Status.unschedulable(ERR_REASON, unresolvable=True)
        return Status.success()
