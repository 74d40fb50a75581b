"""What a Deployment rollout is computed from: its constants, arithmetic and conditions.

As Kubernetes' `pkg/controller/deployment/util`: the annotation and condition-reason
names, the maxSurge / maxUnavailable fenceposts (percentages against the desired
count, surge rounded up, unavailable down), the pod-template hash and template
comparison, a ReplicaSet's revision, and the Progressing / Available condition
helpers (set, remove, complete, progressing, timed out).  All pure; the one pass
that uses them is `fleet/controllers/deployment_plan.py`, the I/O loop
`fleet/controllers/deployment.py`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any

from fleet.api.conditions import find
from fleet.controllers.replicaset import meta, parse_time, rfc3339

API_VERSION, KIND = "apps/v1", "Deployment"
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Annotations a Deployment does not hand down to its ReplicaSets.
SKIP_COPY = frozenset({LAST_APPLIED, REVISION, REVISION_HISTORY, DESIRED_REPLICAS, MAX_REPLICAS,
                       "deprecated.deployment.rollback.to"})
MAX_REVISION_HISTORY_CHARS = 2000
NO_DEADLINE = 2 ** 31 - 1  # progressDeadlineSeconds meaning "never" (MaxInt32)

# Condition reasons, as Kubernetes spells them.
NEW_RS_CREATED = "NewReplicaSetCreated"
FOUND_NEW_RS = "FoundNewReplicaSet"
RS_UPDATED = "ReplicaSetUpdated"
NEW_RS_AVAILABLE = "NewReplicaSetAvailable"
TIMED_OUT = "ProgressDeadlineExceeded"
RS_CREATE_ERROR = "ReplicaSetCreateError"
PAUSED = "DeploymentPaused"
RESUMED = "DeploymentResumed"
MIN_AVAILABLE = "MinimumReplicasAvailable"
MIN_UNAVAILABLE = "MinimumReplicasUnavailable"

_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"

Obj = dict[str, Any]


# ---------------------------------------------------------------------------------------
# Arithmetic


def scaled_value(value: int | str | None, total: int, round_up: bool) -> int:
    """An IntOrString (maxSurge, maxUnavailable) against `total`: ints as they are,
    "N%" rounded up or down."""
    if value is None:
        return 0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            pct = int(text[:-1])
            exact = pct * total / 100
            return math.ceil(exact) if round_up else math.floor(exact)
        return int(text)
    return int(value)


def resolve_fenceposts(max_surge: int | str | None, max_unavailable: int | str | None,
                       desired: int) -> tuple[int, int]:
    """(surge, unavailable) for `desired` replicas: surge rounds up, unavailable down;
    if both come to 0, unavailable is 1 so the rollout can move at all."""
    surge = scaled_value(max_surge if max_surge is not None else 0, desired, True)
    unavailable = scaled_value(max_unavailable if max_unavailable is not None else 0, desired, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def spec_of(d: Mapping[str, Any]) -> dict[str, Any]:
    return d.get("spec") or {}


def replicas_of(obj: Mapping[str, Any]) -> int:
    r = spec_of(obj).get("replicas")
    return 1 if r is None else int(r)


def is_rolling(d: Mapping[str, Any]) -> bool:
    return ((spec_of(d).get("strategy") or {}).get("type") or "RollingUpdate") == "RollingUpdate"


def _rolling(d: Mapping[str, Any]) -> dict[str, Any]:
    return (spec_of(d).get("strategy") or {}).get("rollingUpdate") or {}


def max_surge(d: Mapping[str, Any]) -> int:
    if not is_rolling(d):
        return 0
    ru = _rolling(d)
    return resolve_fenceposts(ru.get("maxSurge", "25%"), ru.get("maxUnavailable", "25%"),
                              replicas_of(d))[0]


def max_unavailable(d: Mapping[str, Any]) -> int:
    if not is_rolling(d) or replicas_of(d) == 0:
        return 0
    ru = _rolling(d)
    unavailable = resolve_fenceposts(ru.get("maxSurge", "25%"), ru.get("maxUnavailable", "25%"),
                                     replicas_of(d))[1]
    return min(unavailable, replicas_of(d))


# ---------------------------------------------------------------------------------------
# Templates, hashes, revisions


def _canonical(value: Any) -> Any:
    """A JSON value with empty maps/lists and nulls dropped from objects: Kubernetes
    compares templates treating "absent" and "empty" alike."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            c = _canonical(v)
            if c is None or c == {} or c == []:
                continue
            out[k] = c
        return out
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _without_hash(template: Mapping[str, Any] | None) -> Any:
    t = copy.deepcopy(dict(template or {}))
    labels = (t.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
    return _canonical(t)


def equal_ignore_hash(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Two pod templates equal but for the pod-template-hash label."""
    return _without_hash(a) == _without_hash(b)


def fnv32a(data: bytes, h: int = 0x811C9DC5) -> int:
    for byte in data:
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def template_hash(template: Mapping[str, Any], collision_count: int | None = None) -> str:
    """The pod-template-hash of a template (and the Deployment's collision count)."""
    data = json.dumps(_canonical(dict(template)), sort_keys=True, separators=(",", ":")).encode()
    h = fnv32a(data)
    if collision_count is not None:
        # As Kubernetes: the count as 4 little-endian bytes in an 8-byte buffer.
        h = fnv32a(int(collision_count).to_bytes(4, "little", signed=False) + b"\0" * 4, h)
    return "".join(_ALPHANUMS[ord(ch) % len(_ALPHANUMS)] for ch in str(h))


def revision(rs: Mapping[str, Any]) -> int:
    try:
        return int((meta(rs).get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def created_order(rs: Mapping[str, Any]) -> tuple[float, str]:
    return (parse_time(meta(rs).get("creationTimestamp")) or 0.0, str(meta(rs).get("name") or ""))


def rs_replicas(rs: Mapping[str, Any]) -> int:
    return int(spec_of(rs).get("replicas") or 0)


def rs_status(rs: Mapping[str, Any] | None, key: str) -> int:
    return int(((rs or {}).get("status") or {}).get(key) or 0)


def annotations_of(obj: dict[str, Any]) -> dict[str, Any]:
    md = obj.setdefault("metadata", {})
    if not isinstance(md.get("annotations"), dict):
        md["annotations"] = {}
    return md["annotations"]


def has_deadline(d: Mapping[str, Any]) -> bool:
    pds = spec_of(d).get("progressDeadlineSeconds")
    return pds is not None and int(pds) != NO_DEADLINE


# ---------------------------------------------------------------------------------------
# Conditions


def get_condition(status: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    """deploymentutil.GetDeploymentCondition: the condition of a DeploymentStatus."""
    return find(status.get("conditions"), ctype)


def new_condition(ctype: str, status: str, reason: str, message: str, now: float) -> dict[str, Any]:
    ts = rfc3339(now)
    return {"type": ctype, "status": status, "lastUpdateTime": ts, "lastTransitionTime": ts,
            "reason": reason, "message": message}


def set_condition(status: dict[str, Any], cond: dict[str, Any]) -> None:
    """Kubernetes' SetDeploymentCondition: no-op for the same status and reason; the
    transition time kept while the status stays the same."""
    current = get_condition(status, cond["type"])
    if current is not None and current.get("status") == cond["status"] and \
            current.get("reason") == cond["reason"]:
        return
    if current is not None and current.get("status") == cond["status"]:
        cond = {**cond, "lastTransitionTime": current.get("lastTransitionTime")}
    status["conditions"] = [c for c in status.get("conditions") or []
                            if c.get("type") != cond["type"]] + [cond]


def remove_condition(status: dict[str, Any], ctype: str) -> None:
    conds = [c for c in status.get("conditions") or [] if c.get("type") != ctype]
    if conds:
        status["conditions"] = conds
    else:
        status.pop("conditions", None)


def deployment_complete(d: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    n = replicas_of(d)
    return (int(status.get("updatedReplicas") or 0) == n and int(status.get("replicas") or 0) == n
            and int(status.get("availableReplicas") or 0) == n
            and int(status.get("observedGeneration") or 0) >= int(meta(d).get("generation") or 0))


def deployment_progressing(d: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Did a count move forward compared with the status the Deployment has now?"""
    old = d.get("status") or {}

    def n(s: Mapping[str, Any], k: str) -> int:
        return int(s.get(k) or 0)

    return (n(new, "updatedReplicas") > n(old, "updatedReplicas")
            or n(new, "replicas") - n(new, "updatedReplicas") < n(old, "replicas") - n(old, "updatedReplicas")
            or n(new, "readyReplicas") > n(old, "readyReplicas")
            or n(new, "availableReplicas") > n(old, "availableReplicas"))


def deployment_timed_out(d: Mapping[str, Any], status: Mapping[str, Any], now: float) -> bool:
    if not has_deadline(d):
        return False
    cond = get_condition(status, "Progressing")
    if cond is None or cond.get("reason") == NEW_RS_AVAILABLE:
        return False
    if cond.get("reason") == TIMED_OUT:
        return True
    since = parse_time(cond.get("lastUpdateTime"))
    if since is None:
        return False
    return since + int(spec_of(d)["progressDeadlineSeconds"]) < now
