"""ControllerRevision history for the StatefulSet and DaemonSet controllers (pure).

Both controllers snapshot each pod template they run as an `apps/v1`
ControllerRevision and label their pods with the snapshot they were made from,
so "is this pod current?" is a label comparison, rollbacks find the old
template, and `kubectl rollout history|undo` work.  The snapshot (`data`) is
the strategic merge patch Kubernetes stores, `{"spec": {"template": {...,
"$patch": "replace"}}}`: `kubectl rollout undo` sends exactly that patch back
to the workload.

Names follow k8s.io/kubernetes `pkg/controller/history`: `<owner>-<hash>`,
the hash being FNV-32 of the data (plus the owner's `collisionCount`, bumped
when two different templates hash alike) spelled in the vowel-free alphabet
of apimachinery's `rand.SafeEncodeString`, so names never spell words.  Our
JSON is not Go's byte for byte, so the hashes differ from a real cluster's —
nothing compares them across systems.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from fleet.api import validation as v

# Label on a ControllerRevision carrying its hash (StatefulSet revisions).
REVISION_HASH_LABEL = "controller.kubernetes.io/hash"
# Label on pods (and DaemonSet revisions) naming the revision they came from.
POD_REVISION_LABEL = "controller-revision-hash"
PATCH_DIRECTIVE = "$patch"
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"
_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619
MAX_PREFIX = 223  # so that prefix + "-" + hash stays a valid 253-character name


def fnv32(data: bytes) -> int:
    """FNV-1 32-bit (Go's hash/fnv New32: multiply, then xor)."""
    h = _FNV_OFFSET
    for b in data:
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
        h ^= b
    return h


def safe_encode(s: str) -> str:
    """apimachinery rand.SafeEncodeString: each byte mapped into a vowel-free alphabet."""
    return "".join(_ALPHANUMS[b % len(_ALPHANUMS)] for b in s.encode())


def canonical(value: Any) -> bytes:
    """Deterministic JSON bytes: what revisions are hashed and compared by."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def hash_data(data: Any, collision_count: int | None) -> str:
    raw = canonical(data)
    if collision_count is not None:
        raw += str(collision_count).encode()
    return safe_encode(str(fnv32(raw)))


def revision_name(prefix: str, hash_: str) -> str:
    return f"{prefix[:MAX_PREFIX]}-{hash_}"


def template_patch(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The revision data for a workload: a patch that restores its pod template."""
    template = copy.deepcopy((workload.get("spec") or {}).get("template") or {})
    template[PATCH_DIRECTIVE] = "replace"
    return {"spec": {"template": template}}


def template_of(revision: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template a revision restores."""
    data = revision.get("data") or {}
    template = copy.deepcopy(((data.get("spec") or {}) if isinstance(data, dict) else {}).get("template") or {})
    template.pop(PATCH_DIRECTIVE, None)
    return template


def same_data(revision: Mapping[str, Any], data: Any) -> bool:
    """Whether `revision` holds exactly `data` (history.EqualRevision)."""
    return canonical(revision.get("data")) == canonical(data)


def number(revision: Mapping[str, Any]) -> int:
    n = revision.get("revision")
    return n if v.as_int(n) is not None else 0


def sort_revisions(revisions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Oldest first: by revision number, then creation time, then name (history.SortControllerRevisions)."""
    def key(r: Mapping[str, Any]) -> tuple[int, str, str]:
        md = r.get("metadata") or {}
        return number(r), str(md.get("creationTimestamp") or ""), str(md.get("name") or "")
    return sorted((dict(r) for r in revisions), key=key)


def next_number(revisions: list[dict[str, Any]]) -> int:
    return max((number(r) for r in revisions), default=0) + 1


def choose_update_revision(revisions: list[dict[str, Any]], data: Any) -> tuple[str, dict[str, Any] | None, int]:
    """Which revision the live template is (StatefulSet's getStatefulSetRevisions).

    Returns one of
    - ("existing", rev, n): the newest revision already holds the template;
    - ("renumber", rev, n): an older revision holds it (a rollback): give it number n;
    - ("create", None, n): a new template: snapshot it as revision n.
    `revisions` must be sorted oldest first.
    """
    n = next_number(revisions)
    equal = [r for r in revisions if same_data(r, data)]
    if equal and revisions and equal[-1] is revisions[-1]:
        return "existing", revisions[-1], number(revisions[-1])
    if equal:
        return "renumber", equal[-1], n
    return "create", None, n


def build_revision(owner: Mapping[str, Any], owner_ref: dict[str, Any], data: Any, revision: int, *,
                   name: str, labels: Mapping[str, str],
                   annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    md = owner.get("metadata") or {}
    meta: dict[str, Any] = {"name": name, "namespace": md.get("namespace"), "labels": dict(labels),
                            "ownerReferences": [owner_ref]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": meta,
            "data": copy.deepcopy(data), "revision": revision}


def history_to_delete(revisions: list[dict[str, Any]], live: set[str], limit: int) -> list[dict[str, Any]]:
    """Non-live revisions beyond `limit`, oldest first (truncateHistory / cleanupHistory).

    Live revisions — the current and update revisions and any a pod still runs — are
    never deleted: a rollback or a pod restart may need them.
    """
    if limit < 0:
        return []
    old = [r for r in sort_revisions(revisions) if (r.get("metadata") or {}).get("name") not in live]
    excess = len(old) - limit
    return old[:excess] if excess > 0 else []
