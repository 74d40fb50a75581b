"""Pod facts and ownership helpers shared by the StatefulSet and DaemonSet controllers (pure).

* readiness as k8s.io/kubernetes `pkg/api/v1/pod` defines it: Ready means the
  `Ready` condition is True; *available* means ready for at least
  `minReadySeconds` (by the condition's lastTransitionTime);
* controller references (`controller: true`, `blockOwnerDeletion: true`) and
  the claim step of client-go's ControllerRefManager: a controller owns the
  objects that name it as controller, adopts matching orphans and releases
  owned objects whose labels stopped matching — so `kubectl delete
  --cascade=orphan` followed by re-creating the workload picks its pods back up;
* building a pod from a template (GetPodFromTemplate).
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet.api import meta
from fleet.api import validation as v


def _md(obj: Mapping[str, Any]) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(_md(obj).get("name") or "")


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(_md(obj).get("uid") or "")


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = _md(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def is_terminating(obj: Mapping[str, Any]) -> bool:
    return bool(_md(obj).get("deletionTimestamp"))


def is_finished(pod: Mapping[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def ready_condition(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c
    return None


def is_ready(pod: Mapping[str, Any]) -> bool:
    c = ready_condition(pod)
    return c is not None and c.get("status") == "True"


def is_running_and_ready(pod: Mapping[str, Any]) -> bool:
    return phase(pod) == "Running" and is_ready(pod)


def _epoch(ts: Any) -> float | None:
    if not isinstance(ts, str) or not ts:
        return None
    try:
        t = meta.parse_rfc3339(ts)
    except ValueError:
        return None
    return (t if t.tzinfo is not None else t.replace(tzinfo=_dt.UTC)).timestamp()


def available_at(pod: Mapping[str, Any], min_ready_seconds: int) -> float | None:
    """Wall-clock time at which a ready pod counts as available (None when not ready)."""
    if not is_ready(pod):
        return None
    if min_ready_seconds <= 0:
        return 0.0
    since = _epoch((ready_condition(pod) or {}).get("lastTransitionTime"))
    return 0.0 if since is None else since + min_ready_seconds


def is_available(pod: Mapping[str, Any], min_ready_seconds: int, now: float) -> bool:
    """podutil.IsPodAvailable: ready, and for at least min_ready_seconds at wall time `now`."""
    at = available_at(pod, min_ready_seconds)
    return at is not None and (min_ready_seconds <= 0 or at <= now)


# ---------------------------------------------------------------------------------------
# Controller references and claiming


def controller_ref(owner: Mapping[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    """metav1.NewControllerRef: the owner reference a controller puts on what it creates."""
    return {"apiVersion": api_version, "kind": kind, "name": name_of(owner), "uid": uid_of(owner),
            "controller": True, "blockOwnerDeletion": True}


def controller_of(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in _md(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def orphan_namespace(obj: Mapping[str, Any]) -> list[str]:
    """Informer index: the namespace of an object no controller owns (adoption candidates),
    so a controller finds orphans without walking every pod of the namespace."""
    return [str(_md(obj).get("namespace") or "")] if controller_of(obj) is None else []


def is_controlled_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    ref = controller_of(obj)
    return ref is not None and str(ref.get("uid")) == owner_uid


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels/matchExpressions) against labels; empty or bad selects nothing."""
    if not isinstance(selector, dict) or v.selector_is_empty(selector):
        return False
    if v.validate_label_selector(selector, "selector"):
        return False
    return v.selector_matches(selector, dict(labels))


def claim(owner: Mapping[str, Any], candidates: Iterable[dict[str, Any]],
          matches: Callable[[dict[str, Any]], bool]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                          list[dict[str, Any]]]:
    """ControllerRefManager.Claim: (owned, to_adopt, to_release) among `candidates`.

    Owned objects that still match stay owned; owned ones that do not are to be
    released; matching orphans are to be adopted (never while the owner is being
    deleted, nor objects being deleted).  Objects controlled by someone else are
    none of our business.
    """
    uid = uid_of(owner)
    owned: list[dict[str, Any]] = []
    adopt: list[dict[str, Any]] = []
    release: list[dict[str, Any]] = []
    deleting = is_terminating(owner)
    for obj in candidates:
        ref = controller_of(obj)
        if ref is not None:
            if str(ref.get("uid")) != uid:
                continue
            if matches(obj):
                owned.append(obj)
            elif not deleting:
                release.append(obj)
            else:
                owned.append(obj)
            continue
        if deleting or is_terminating(obj) or not matches(obj):
            continue
        adopt.append(obj)
    return owned, adopt, release


def adopt_patch(obj: Mapping[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """A merge patch making `ref` the controller of `obj`, conditional on its resourceVersion."""
    refs = [r for r in _md(obj).get("ownerReferences") or []
            if isinstance(r, dict) and r.get("uid") != ref.get("uid")]
    return {"metadata": {"ownerReferences": [*refs, ref],
                         "resourceVersion": _md(obj).get("resourceVersion")}}


def release_patch(obj: Mapping[str, Any], owner_uid: str) -> dict[str, Any]:
    """A merge patch removing the owner reference to `owner_uid`, conditional on resourceVersion."""
    refs = [r for r in _md(obj).get("ownerReferences") or []
            if not (isinstance(r, dict) and r.get("uid") == owner_uid)]
    return {"metadata": {"ownerReferences": refs or None,
                         "resourceVersion": _md(obj).get("resourceVersion")}}


def pod_from_template(template: Mapping[str, Any], namespace: str,
                      owner_ref: dict[str, Any]) -> dict[str, Any]:
    """controller.GetPodFromTemplate: labels, annotations, finalizers and spec of the template."""
    tmeta = template.get("metadata") or {}
    md: dict[str, Any] = {"namespace": namespace, "ownerReferences": [dict(owner_ref)]}
    for key in ("labels", "annotations"):
        if isinstance(tmeta.get(key), dict):
            md[key] = dict(tmeta[key])
    if isinstance(tmeta.get("finalizers"), list) and tmeta["finalizers"]:
        md["finalizers"] = list(tmeta["finalizers"])
    md.setdefault("labels", {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": copy.deepcopy(template.get("spec") or {})}
