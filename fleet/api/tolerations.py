"""Taints and tolerations: the one matcher every role uses (no I/O).

The scheduler's TaintToleration plugin, the DaemonSet controller (which
nodes may run a daemon pod) and node lifecycle (when a NoExecute taint evicts
a pod) must agree on what "this toleration covers that taint" means, so it is
written once, as Kubernetes' `Toleration.ToleratesTaint`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def toleration_matches(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint: effect (empty = any), key (empty = any, with
    Exists), then operator Exists or Equal (value compared, empty equal to absent)."""
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


def tolerates(tolerations: Iterable[Any], taint: Mapping[str, Any]) -> bool:
    """Whether any (well-formed) toleration covers `taint`."""
    return any(isinstance(t, dict) and toleration_matches(t, taint) for t in tolerations)


def untolerated(taints: Iterable[Any], tolerations: Sequence[Any], effects: tuple[str, ...]) -> bool:
    """Whether some taint with one of `effects` is covered by none of the tolerations."""
    return any(isinstance(taint, dict) and taint.get("effect") in effects and not tolerates(tolerations, taint)
               for taint in taints)


__all__ = ["toleration_matches", "tolerates", "untolerated"]
