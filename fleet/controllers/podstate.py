"""Pod facts shared by the StatefulSet and DaemonSet controllers (pure).

* readiness as k8s.io/kubernetes `pkg/api/v1/pod` defines it: Ready means the
  `Ready` condition is True; *available* means ready for at least
  `minReadySeconds` (by the condition's lastTransitionTime);
* what a workload's selector selects (an empty one: nothing);
* building a pod from a template (GetPodFromTemplate).

Owner references and the claim step (adopt / release) are `fleet.api.owners`.
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Mapping
from typing import Any

from fleet.api import meta
from fleet.api.conditions import is_pod_ready, pod_ready_condition
from fleet.api.selectors import selector_dict_matches


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


def is_ready(pod: Mapping[str, Any]) -> bool:
    return is_pod_ready(pod)


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
    since = _epoch((pod_ready_condition(pod) or {}).get("lastTransitionTime"))
    return 0.0 if since is None else since + min_ready_seconds


def is_available(pod: Mapping[str, Any], min_ready_seconds: int, now: float) -> bool:
    """podutil.IsPodAvailable: ready, and for at least min_ready_seconds at wall time `now`."""
    at = available_at(pod, min_ready_seconds)
    return at is not None and (min_ready_seconds <= 0 or at <= now)


# ---------------------------------------------------------------------------------------
# Selecting


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A workload's LabelSelector against labels: an empty or bad selector selects nothing
    (validation refuses both for StatefulSets and DaemonSets)."""
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    return selector_dict_matches(selector, labels)


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
