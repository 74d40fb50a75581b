"""NodeAffinity (plugin name as in Kubernetes): nodeSelector and required node affinity.

A pod runs only on nodes whose labels match every `spec.nodeSelector` entry
and, when it has `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`,
at least one of its nodeSelectorTerms (the terms are ORed; inside a term the
matchExpressions and matchFields are ANDed).  Preferred affinity is a scoring
concern and arrives with the full framework.
"""

from __future__ import annotations

from typing import Any

from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.snapshot import NodeInfo

ERR_REASON = "node(s) didn't match Pod's node affinity/selector"


def _expression_matches(expr: dict[str, Any], values_of: dict[str, str]) -> bool:
    key = expr.get("key")
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in values_of
    have = values_of.get(str(key))
    if op == "In":
        return present and have in values
    if op == "NotIn":
        return not present or have not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            a, b = int(str(have)), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False  # an unknown operator selects nothing, as upstream


def term_matches(term: dict[str, Any], node: NodeInfo) -> bool:
    """One NodeSelectorTerm; an empty term matches no node (Kubernetes semantics)."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    labels = node.labels
    if not all(isinstance(e, dict) and _expression_matches(e, labels) for e in exprs):
        return False
    node_fields = {"metadata.name": node.name}
    return all(isinstance(f, dict) and _expression_matches(f, node_fields) for f in fields)


class NodeAffinity:
    name = "NodeAffinity"
    _key = "NodeAffinity/required"

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        spec = pod.get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        if not selector and not required:
            return Status(Code.SKIP)
        terms = (required or {}).get("nodeSelectorTerms") if required else None
        state.write(self._key, (dict(selector), terms))
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        selector, terms = state.read(self._key)
        labels = node.labels
        ok = all(labels.get(k) == v for k, v in selector.items())
        if ok and terms is not None:
            ok = any(isinstance(t, dict) and term_matches(t, node) for t in terms)
        return Status.success() if ok else Status.unschedulable(ERR_REASON, unresolvable=True)
