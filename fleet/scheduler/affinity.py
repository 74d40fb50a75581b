"""Label selectors and pod (anti-)affinity terms, parsed once per pod: the
`AffinityTerm`s of a pod's required and preferred (anti-)affinity with their
namespaces resolved, which `snapshot.py` groups across bound pods and
InterPodAffinity / PodTopologySpread match against.
"""


from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.api.errors import BadRequest
from fleet.api.selectors import IN, NOT_IN, LabelSelector, Requirement, label_selector_from_dict

NOTHING = LabelSelector(nothing=True)
EVERYTHING = LabelSelector()

# Kinds of pod (anti-)affinity terms indexed by `Snapshot.term_groups`.
REQUIRED_AFFINITY = "requiredAffinity"
REQUIRED_ANTI_AFFINITY = "requiredAntiAffinity"
PREFERRED_AFFINITY = "preferredAffinity"
PREFERRED_ANTI_AFFINITY = "preferredAntiAffinity"
TERM_KINDS = (REQUIRED_AFFINITY, REQUIRED_ANTI_AFFINITY, PREFERRED_AFFINITY, PREFERRED_ANTI_AFFINITY)

# ---------------------------------------------------------------------------
# Label selectors and pod (anti-)affinity terms, parsed once.
# ---------------------------------------------------------------------------


def parse_selector(raw: Any) -> LabelSelector:
    """An API LabelSelector; None selects nothing and {} everything (metav1 semantics).

    Raises ValueError on a malformed selector (admission should have refused it).
    """
    try:
        return label_selector_from_dict(raw)
    except BadRequest as e:
        raise ValueError(e.message) from None


def merge_label_keys(selector: LabelSelector, labels: Mapping[str, str],
                     match_keys: Iterable[str] = (), mismatch_keys: Iterable[str] = ()) -> LabelSelector:
    """`matchLabelKeys` / `mismatchLabelKeys`: pin the selector to the pod's own values of those keys.

    A key the pod does not carry is ignored, and a nil selector stays nil, as
    upstream.  (Since Kubernetes 1.31 the API server folds these keys into the
    selector at creation; adding the same requirement twice is harmless, so
    doing it here too keeps older objects right.)
    """
    if selector.nothing:
        return selector
    extra = [Requirement(str(k), IN, (labels[k],)) for k in match_keys if k in labels]
    extra += [Requirement(str(k), NOT_IN, (labels[k],)) for k in mismatch_keys if k in labels]
    if not extra:
        return selector
    return LabelSelector.of(selector.requirements + tuple(extra))


@dataclass(frozen=True)
class AffinityTerm:
    """A parsed PodAffinityTerm; hashable, so identical terms of many pods index together.

    `namespaces` already holds the owning pod's namespace when the term names
    neither namespaces nor a namespaceSelector; `namespace_selector` is
    NOTHING when absent and EVERYTHING for `{}` (all namespaces).
    """

    namespaces: frozenset[str]
    namespace_selector: LabelSelector
    selector: LabelSelector
    topology_key: str

    def matches(self, namespace: str, labels: Mapping[str, str],
                namespace_labels: Mapping[str, str] | None) -> bool:
        """Kubernetes' AffinityTerm.Matches: right namespace, then the label selector."""
        if namespace in self.namespaces or (
                not self.namespace_selector.nothing
                and self.namespace_selector.matches(namespace_labels)):  # type: ignore[arg-type]
            return self.selector.matches(labels)  # type: ignore[arg-type]
        return False


@dataclass(frozen=True)
class PodAffinity:
    """A pod's pod-affinity and pod-anti-affinity, required and preferred (with weights)."""

    required_affinity: tuple[AffinityTerm, ...] = ()
    required_anti_affinity: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[tuple[AffinityTerm, int], ...] = ()
    preferred_anti_affinity: tuple[tuple[AffinityTerm, int], ...] = ()

    def by_kind(self) -> Iterable[tuple[str, AffinityTerm, int]]:
        for t in self.required_affinity:
            yield REQUIRED_AFFINITY, t, 0
        for t in self.required_anti_affinity:
            yield REQUIRED_ANTI_AFFINITY, t, 0
        for t, w in self.preferred_affinity:
            yield PREFERRED_AFFINITY, t, w
        for t, w in self.preferred_anti_affinity:
            yield PREFERRED_ANTI_AFFINITY, t, w

    def __bool__(self) -> bool:
        return bool(self.required_affinity or self.required_anti_affinity
                    or self.preferred_affinity or self.preferred_anti_affinity)


def parse_affinity_term(raw: Any, namespace: str, labels: Mapping[str, str]) -> AffinityTerm:
    """One PodAffinityTerm of a pod in `namespace` with `labels`; ValueError if malformed."""
    if not isinstance(raw, dict):
        raise ValueError(f"pod affinity term must be an object, not {raw!r}")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ValueError("pod affinity term has an empty topologyKey")
    selector = merge_label_keys(parse_selector(raw.get("labelSelector")), labels,
                                raw.get("matchLabelKeys") or (), raw.get("mismatchLabelKeys") or ())
    names = [str(n) for n in raw.get("namespaces") or []]
    raw_ns_selector = raw.get("namespaceSelector")
    ns_selector = NOTHING if raw_ns_selector is None else parse_selector(raw_ns_selector)
    if not names and raw_ns_selector is None:
        names = [namespace]
    return AffinityTerm(frozenset(names), ns_selector, selector, key)


def pod_affinity(pod: dict[str, Any], *, strict: bool = False) -> PodAffinity | None:
    """The pod's parsed pod (anti-)affinity, or None when it has none.

    `strict` raises ValueError on a malformed term (the pod being scheduled:
    kube-scheduler refuses it "parsing pod: ..."); otherwise bad terms of pods
    already bound are dropped, since they cannot be fixed from here.
    """
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    pa = affinity.get("podAffinity") or {} if isinstance(affinity, dict) else {}
    paa = affinity.get("podAntiAffinity") or {} if isinstance(affinity, dict) else {}
    if not pa and not paa:
        return None
    if not isinstance(pa, dict) or not isinstance(paa, dict):
        if strict:
            raise ValueError("podAffinity and podAntiAffinity must be objects")
        return None
    md = pod.get("metadata") or {}
    ns = str(md.get("namespace") or "")
    labels = md.get("labels") or {}

    def required(src: dict[str, Any]) -> tuple[AffinityTerm, ...]:
        out = []
        for raw in src.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            try:
                out.append(parse_affinity_term(raw, ns, labels))
            except (AttributeError, TypeError, ValueError) as e:
                if strict:
                    raise ValueError(str(e)) from None
        return tuple(out)

    def preferred(src: dict[str, Any]) -> tuple[tuple[AffinityTerm, int], ...]:
        out = []
        for raw in src.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
            try:
                if not isinstance(raw, dict):
                    raise ValueError(f"weighted pod affinity term must be an object, not {raw!r}")
                weight = int(raw.get("weight") or 0)
                out.append((parse_affinity_term(raw.get("podAffinityTerm"), ns, labels), weight))
            except (AttributeError, TypeError, ValueError) as e:
                if strict:
                    raise ValueError(str(e)) from None
        return tuple(out)

    parsed = PodAffinity(required(pa), required(paa), preferred(pa), preferred(paa))
    return parsed if parsed else None
