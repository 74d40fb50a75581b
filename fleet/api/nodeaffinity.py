"""Node selection: `nodeSelector` and node affinity terms, matched against a node (pure).

One matcher for everything that asks "may this pod run on that node": the
scheduler's NodeAffinity filter and score, PodTopologySpread's
nodeAffinityPolicy=Honor, and the DaemonSet controller's NodeShouldRunDaemonPod
(Kubernetes shares component-helpers' nodeaffinity between them the same way).

A pod runs only on nodes whose labels match every `nodeSelector` entry and,
when it has `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`,
at least one of its nodeSelectorTerms (the terms are ORed; inside a term the
matchExpressions and matchFields are ANDed).  `matchFields` supports the one
field Kubernetes does, `metadata.name`, with In/NotIn and a single value
(DaemonSet pods pin themselves this way).  A term that is empty or malformed
(unknown operator, In without values, Gt with a non-integer) matches no node,
exactly as upstream, rather than failing the pod.

Terms are compiled once into tuples, so the per-node work is a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


def term_matches(term: CompiledTerm, labels: Mapping[str, str], name: str) -> bool:
    """Whether a node with these labels and this name matches a compiled term."""
    label_reqs, field_reqs = term
    for r in label_reqs:
        if not _requirement_matches(r, labels):
            return False
    if field_reqs:
        # An unknown field reads as "", as a fields.Set lookup does upstream.
        fields = {"metadata.name": name}
        for op, key, values, _ in field_reqs:
            if (fields.get(key, "") in values) != (op == _IN):
                return False
    return True


class RequiredNodeAffinity:
    """nodeSelector AND (any of the required nodeSelectorTerms): who may host the pod.

    The scheduler's NodeAffinity filter, PodTopologySpread's nodeAffinityPolicy=Honor
    (only the nodes the pod could land on count) and the DaemonSet controller
    (which nodes should run a daemon pod) all ask this.
    """

    def __init__(self, selector: Mapping[str, str], terms: Sequence[CompiledTerm | None] | None) -> None:
        self.selector = tuple((str(k), str(v)) for k, v in selector.items())
        # None: no required affinity; otherwise the terms that can match (maybe none).
        self.terms = None if terms is None else tuple(t for t in terms if t is not None)

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        for k, v in self.selector:
            if labels.get(k) != v:
                return False
        if self.terms is None:
            return True
        return any(term_matches(t, labels, name) for t in self.terms)


def required_terms(node_affinity: Mapping[str, Any]) -> list[CompiledTerm | None] | None:
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    return [compile_term(t) for t in (required or {}).get("nodeSelectorTerms") or []]


def preferred_terms(node_affinity: Mapping[str, Any]) -> list[tuple[int, CompiledTerm]]:
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


def required_node_affinity(spec: Mapping[str, Any]) -> RequiredNodeAffinity | None:
    """A pod spec's hard node constraints, or None when it has none."""
    selector = spec.get("nodeSelector") or {}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = required_terms(node_affinity)
    if not selector and terms is None:
        return None
    return RequiredNodeAffinity(selector, terms)
