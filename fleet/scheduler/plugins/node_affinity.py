"""NodeAffinity (plugin name as in Kubernetes): nodeSelector, required and preferred node affinity.

Filter: a pod runs only on nodes whose labels match every `spec.nodeSelector`
entry and, when it has `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`,
at least one of its nodeSelectorTerms (the terms are ORed; inside a term the
matchExpressions and matchFields are ANDed).  `matchFields` supports the one
field Kubernetes does, `metadata.name`, with In/NotIn and a single value
(DaemonSet pods pin themselves this way).  A term that is empty or malformed
(unknown operator, In without values, Gt with a non-integer) matches no node,
exactly as upstream, rather than failing the pod.

Score: `preferredDuringSchedulingIgnoredDuringExecution` — a node earns the
weight of every preferred term it matches; the sums are normalized so the
best node scores 100.

Plugin args (NodeAffinityArgs): `addedAffinity` — a node affinity the
scheduler enforces on every pod of the profile, on top of the pod's own
(required: reason "node(s) didn't match scheduler-enforced node affinity";
preferred: added to the score).

The per-pod selector is compiled once in pre_filter / pre_score into tuples,
so the per-node work is a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.plugins._scoring import default_normalize_score
from fleet.scheduler.snapshot import NodeInfo

ERR_REASON = "node(s) didn't match Pod's node affinity/selector"
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"

_IN, _NOT_IN, _EXISTS, _NOT_EXISTS, _GT, _LT = range(6)
_OPS = {"In": _IN, "NotIn": _NOT_IN, "Exists": _EXISTS, "DoesNotExist": _NOT_EXISTS, "Gt": _GT, "Lt": _LT}

# (op, key, values, number)
_Requirement = tuple[int, str, frozenset[str], int]
# (label requirements, field requirements)
CompiledTerm = tuple[tuple[_Requirement, ...], tuple[_Requirement, ...]]


def _compile_requirement(expr: Any, *, field: bool) -> _Requirement | None:
    """One NodeSelectorRequirement, or None if malformed (the term then matches nothing)."""
    if not isinstance(expr, dict):
        return None
    key, op = expr.get("key"), _OPS.get(str(expr.get("operator")))
    values = expr.get("values") or []
    if not isinstance(key, str) or op is None or not isinstance(values, list):
        return None
    values = [str(v) for v in values]
    if field:
        # Field selectors know only equality: In / NotIn with exactly one value.
        if op not in (_IN, _NOT_IN) or len(values) != 1:
            return None
        return (op, key, frozenset(values), 0)
    if op in (_IN, _NOT_IN):
        return (op, key, frozenset(values), 0) if values else None
    if op in (_EXISTS, _NOT_EXISTS):
        return None if values else (op, key, frozenset(), 0)
    if len(values) != 1:
        return None
    try:
        return (op, key, frozenset(), int(values[0]))
    except ValueError:
        return None


def compile_term(term: Any) -> CompiledTerm | None:
    """A NodeSelectorTerm, or None when it can match no node (empty or malformed)."""
    if not isinstance(term, dict):
        return None
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return None  # an empty term matches nothing (Kubernetes semantics)
    labels = tuple(_compile_requirement(e, field=False) for e in exprs)
    fieldreqs = tuple(_compile_requirement(f, field=True) for f in fields)
    if None in labels or None in fieldreqs:
        return None
    return labels, fieldreqs  # type: ignore[return-value]


def _requirement_matches(req: _Requirement, values_of: Mapping[str, str]) -> bool:
    op, key, values, number = req
    have = values_of.get(key)
    if op == _IN:
        return have is not None and have in values
    if op == _NOT_IN:
        return have is None or have not in values
    if op == _EXISTS:
        return have is not None
    if op == _NOT_EXISTS:
        return have is None
    if have is None:
        return False
    try:
        n = int(have)
    except ValueError:
        return False
    return n > number if op == _GT else n < number


def term_matches(term: CompiledTerm, node: NodeInfo) -> bool:
    label_reqs, field_reqs = term
    labels = node.labels
    for r in label_reqs:
        if not _requirement_matches(r, labels):
            return False
    if field_reqs:
        # An unknown field reads as "", as a fields.Set lookup does upstream.
        fields = {"metadata.name": node.name}
        for op, key, values, _ in field_reqs:
            if (fields.get(key, "") in values) != (op == _IN):
                return False
    return True


class RequiredNodeAffinity:
    """nodeSelector AND (any of the required nodeSelectorTerms): who may host the pod.

    Shared with PodTopologySpread, whose nodeAffinityPolicy=Honor counts only
    the nodes the pod could land on.
    """

    def __init__(self, selector: Mapping[str, str], terms: Sequence[CompiledTerm | None] | None) -> None:
        self.selector = tuple((str(k), str(v)) for k, v in selector.items())
        # None: no required affinity; otherwise the terms that can match (maybe none).
        self.terms = None if terms is None else tuple(t for t in terms if t is not None)

    def matches(self, node: NodeInfo) -> bool:
        labels = node.labels
        for k, v in self.selector:
            if labels.get(k) != v:
                return False
        if self.terms is None:
            return True
        return any(term_matches(t, node) for t in self.terms)


def _required_terms(node_affinity: Mapping[str, Any]) -> list[CompiledTerm | None] | None:
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    return [compile_term(t) for t in (required or {}).get("nodeSelectorTerms") or []]


def _preferred_terms(node_affinity: Mapping[str, Any]) -> list[tuple[int, CompiledTerm]]:
    out = []
    for p in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        if not isinstance(p, dict):
            continue
        try:
            weight = int(p.get("weight") or 0)
        except (TypeError, ValueError):
            continue
        term = compile_term(p.get("preference"))
        if weight and term is not None:
            out.append((weight, term))
    return out


def required_node_affinity(pod: dict[str, Any]) -> RequiredNodeAffinity | None:
    """The pod's hard node constraints, or None when it has none."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = _required_terms(node_affinity)
    if not selector and terms is None:
        return None
    return RequiredNodeAffinity(selector, terms)


class NodeAffinity:
    name = "NodeAffinity"
    _key = "NodeAffinity/required"
    _score_key = "NodeAffinity/preferred"

    def __init__(self, *, added_affinity: Mapping[str, Any] | None = None) -> None:
        added = dict(added_affinity or {})
        terms = _required_terms(added)
        self.added_required = None if terms is None else RequiredNodeAffinity({}, terms)
        self.added_preferred = _preferred_terms(added)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> NodeAffinity:
        """From NodeAffinityArgs (`addedAffinity`)."""
        unknown = set(args) - {"addedAffinity"}
        if unknown:
            raise ValueError(f"unknown NodeAffinity args: {sorted(unknown)}")
        return cls(added_affinity=args.get("addedAffinity"))

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        required = required_node_affinity(pod)
        if required is None and self.added_required is None:
            return Status(Code.SKIP)
        state.write(self._key, required)
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        if self.added_required is not None and not self.added_required.matches(node):
            return Status.unschedulable(ERR_REASON_ENFORCED, unresolvable=True)
        required: RequiredNodeAffinity | None = state.read(self._key)
        if required is not None and not required.matches(node):
            return Status.unschedulable(ERR_REASON, unresolvable=True)
        return Status.success()

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        node_affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
        preferred = self.added_preferred + _preferred_terms(node_affinity)
        if not preferred:
            return Status(Code.SKIP)
        state.write(self._score_key, preferred)
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        preferred: list[tuple[int, CompiledTerm]] = state.read(self._score_key)
        return sum(w for w, t in preferred if term_matches(t, node))

    def normalize_score(self, state: CycleState, pod: dict[str, Any], scores: dict[str, int]) -> None:
        default_normalize_score(scores)
