"""TaintToleration: a node's taints keep off pods that do not tolerate them.

Filter: NoSchedule and NoExecute taints are hard — the first one the pod
does not tolerate rejects the node, named in the reason as kube-scheduler
names it ("node(s) had untolerated taint {key: value}").  Unresolvable:
evicting other pods cannot untaint a node.

Score: PreferNoSchedule taints are soft — a node scores by how many of them
the pod does not tolerate (only tolerations with effect PreferNoSchedule or
empty count), and the counts are reverse-normalized: the fewest intolerable
taints scores 100.  When no node in the cluster has a PreferNoSchedule
taint every node would score 100, so the point is skipped.

`tolerates` (fleet/api/tolerations.py) is shared with NodeUnschedulable, because a cordoned node is
"tainted" `node.kubernetes.io/unschedulable:NoSchedule` for the purpose of
tolerations (DaemonSet pods tolerate it), and with PodTopologySpread's
nodeTaintsPolicy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.api.tolerations import tolerates
from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.plugins._cycle import cycle_snapshot
from fleet.scheduler.plugins._scoring import default_normalize_score
from fleet.scheduler.podinfo import HARD_TAINT_EFFECTS
from fleet.scheduler.snapshot import NodeInfo

PREFER_NO_SCHEDULE = "PreferNoSchedule"


def untolerated_reason(taint: dict[str, Any]) -> str:
    return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"


def untolerated_hard_taint(node: NodeInfo, tolerations: list[Any]) -> dict[str, Any] | None:
    """The node's first NoSchedule/NoExecute taint the tolerations do not cover, if any."""
    for taint in node.taints:
        if isinstance(taint, dict) and taint.get("effect") in HARD_TAINT_EFFECTS \
                and not tolerates(tolerations, taint):
            return taint
    return None


def pod_tolerations(pod: dict[str, Any]) -> list[Any]:
    return (pod.get("spec") or {}).get("tolerations") or []


class TaintToleration:
    name = "TaintToleration"
    _key = "TaintToleration/preferNoSchedule"

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        if not node.taints:
            return Status.success()
        taint = untolerated_hard_taint(node, pod_tolerations(pod))
        if taint is not None:
            return Status.unschedulable(untolerated_reason(taint), unresolvable=True)
        return Status.success()

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        snap = cycle_snapshot(state, nodes)
        if snap is not None and not snap.has_prefer_no_schedule_taints:
            return Status(Code.SKIP)
        soft = [t for t in pod_tolerations(pod)
                if isinstance(t, dict) and (t.get("effect") or "") in ("", PREFER_NO_SCHEDULE)]
        state.write(self._key, soft)
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        tolerations: list[Any] = state.read(self._key)
        return sum(1 for taint in node.taints
                   if isinstance(taint, dict) and taint.get("effect") == PREFER_NO_SCHEDULE
                   and not tolerates(tolerations, taint))

    def normalize_score(self, state: CycleState, pod: dict[str, Any], scores: dict[str, int]) -> None:
        default_normalize_score(scores, reverse=True)
