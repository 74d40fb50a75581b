"""LimitRanger: a namespace's LimitRanges give new pods defaults and bounds.

kube-apiserver's plugin (plugin/pkg/admission/limitranger), in its two halves:

* **mutating** (pod create) — every container and init container that does
  not state a limit or request for a resource gets the LimitRange's
  `default` / `defaultRequest` for it, and the pod is annotated
  `kubernetes.io/limit-ranger: LimitRanger plugin set: cpu, memory request for
  container app; cpu limit for container app`.  It runs before ResourceQuota
  (which needs those values) and before validation (which checks them like
  anything the client sent).
* **validating** (pod create; PersistentVolumeClaim create and update) —
  `min`, `max` and `maxLimitRequestRatio` per Container, per Pod (the sum of
  its containers, init containers counted as Kubernetes counts them) and per
  claim's storage request.  A violation is 403 Forbidden with Kubernetes'
  words: `pods "web" is forbidden: maximum cpu usage per Container is 1, but
  limit is 2`; several are listed as `[a, b]`.

Pods are never re-checked on update: their resources cannot change after
creation.  Two details are Fleet's own, both to land where Kubernetes lands:

* kube-apiserver's pod defaulting copies a limit into a missing request
  *before* admission, so a container with only a limit never gets
  `defaultRequest`.  Fleet's pod defaulting does not do that yet, so this
  plugin does it for the containers it defaults.
* Fleet computes a pod's `status.qosClass` during defaulting, which here runs
  before admission; the class is recomputed after defaults were added, as
  kube-apiserver (which derives it after admission) would show it.

LimitRanges come from a watch-fed cache (`objcache.NamespacedCache`) when one
runs, so namespaces without limit ranges cost nothing on the pod-create path.
"""

from __future__ import annotations

from typing import Any

from fleet.admission.objcache import NamespacedCache
from fleet.admission.priority import forbidden
from fleet.api import meta
from fleet.api import quota as q
from fleet.api.kinds.pods import qos_class
from fleet.api.kinds.quota import LIMIT_TYPE_CONTAINER, LIMIT_TYPE_POD, LIMIT_TYPE_PVC, limit_items
from fleet.auth import Attributes, UserInfo
from fleet.store import Store

PREFIX = meta.store_key("", "limitranges", None)
ANNOTATION = "kubernetes.io/limit-ranger"


def limit_ranges_prefix(namespace: str) -> str:
    return meta.store_key("", "limitranges", namespace)


# ---------------------------------------------------------------------------------------
# Defaults (the mutating half)


def container_defaults(limit_range: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(default requests, default limits) of a LimitRange's Container items, as raw JSON."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for item in limit_items(limit_range):
        if item.get("type") != LIMIT_TYPE_CONTAINER:
            continue
        for src, dst in ((item.get("defaultRequest"), requests), (item.get("default"), limits)):
            for name, value in q.parse_list(src).items():
                dst[name] = str(value)
    return requests, limits


def _merge_container(c: Any, requests: dict[str, Any], limits: dict[str, Any], what: str,
                     notes: list[str]) -> None:
    if not isinstance(c, dict):
        return
    res = c.get("resources")
    if res is None:
        res = c["resources"] = {}
    if not isinstance(res, dict):
        return  # a type error: validation reports it
    for key in ("limits", "requests"):
        if res.get(key) is None:
            res[key] = {}
    have_req, have_lim = res["requests"], res["limits"]
    if not isinstance(have_req, dict) or not isinstance(have_lim, dict):
        return
    # What kube-apiserver's pod defaulting did before admission: a limit is also the request.
    for name, value in have_lim.items():
        have_req.setdefault(name, value)
    set_limits = sorted(n for n in limits if n not in have_lim)
    set_requests = sorted(n for n in requests if n not in have_req)
    for name in set_limits:
        have_lim[name] = limits[name]
    for name in set_requests:
        have_req[name] = requests[name]
    name = c.get("name", "")
    if set_requests:
        notes.append(f"{', '.join(set_requests)} request for {what} {name}")
    if set_limits:
        notes.append(f"{', '.join(set_limits)} limit for {what} {name}")
    for key in ("limits", "requests"):
        if not res[key]:
            del res[key]


def apply_defaults(pod: dict[str, Any], limit_range: dict[str, Any]) -> bool:
    """PodMutateLimitFunc: fill in the LimitRange's container defaults; True if anything changed."""
    requests, limits = container_defaults(limit_range)
    if not requests and not limits:
        return False
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return False
    notes: list[str] = []
    for key, what in (("containers", "container"), ("initContainers", "init container")):
        cs = spec.get(key)
        if isinstance(cs, list):
            for c in cs:
                _merge_container(c, requests, limits, what, notes)
    if not notes:
        return False
    md = pod.setdefault("metadata", {})
    annotations = md.get("annotations")
    if annotations is None:
        annotations = md["annotations"] = {}
    if isinstance(annotations, dict):
        annotations[ANNOTATION] = "LimitRanger plugin set: " + "; ".join(notes)
    return True


# ---------------------------------------------------------------------------------------
# Bounds (the validating half)


def _milli(x: q.Quantity) -> int:
    return x.milli()


def min_constraint(kind: str, name: str, enforced: q.Quantity, requests: q.ResourceList,
                   limits: q.ResourceList) -> str | None:
    req, lim = requests.get(name), limits.get(name)
    if req is None:
        return f"minimum {name} usage per {kind} is {enforced}.  No request is specified"
    if _milli(req) < _milli(enforced):
        return f"minimum {name} usage per {kind} is {enforced}, but request is {req}"
    if lim is not None and _milli(lim) < _milli(enforced):
        return f"minimum {name} usage per {kind} is {enforced}, but limit is {lim}"
    return None


def max_constraint(kind: str, name: str, enforced: q.Quantity, requests: q.ResourceList,
                   limits: q.ResourceList) -> str | None:
    req, lim = requests.get(name), limits.get(name)
    if lim is None:
        return f"maximum {name} usage per {kind} is {enforced}.  No limit is specified"
    if _milli(lim) > _milli(enforced):
        return f"maximum {name} usage per {kind} is {enforced}, but limit is {lim}"
    if req is not None and _milli(req) > _milli(enforced):
        return f"maximum {name} usage per {kind} is {enforced}, but request is {req}"
    return None


def max_request_constraint(kind: str, name: str, enforced: q.Quantity, requests: q.ResourceList) -> str | None:
    """For claims, whose limits mean nothing: the request must not exceed the max."""
    req = requests.get(name)
    if req is None:
        return f"maximum {name} usage per {kind} is {enforced}.  No request is specified"
    if _milli(req) > _milli(enforced):
        return f"maximum {name} usage per {kind} is {enforced}, but request is {req}"
    return None


def ratio_constraint(kind: str, name: str, enforced: q.Quantity, requests: q.ResourceList,
                     limits: q.ResourceList) -> str | None:
    req, lim = requests.get(name), limits.get(name)
    if req is None or _milli(req) == 0:
        return f"{name} max limit to request ratio per {kind} is {enforced}, but no request is specified or " \
               "request is 0"
    if lim is None or _milli(lim) == 0:
        return f"{name} max limit to request ratio per {kind} is {enforced}, but no limit is specified or " \
               "limit is 0"
    ratio = _milli(lim) / _milli(req)
    if ratio * 1000 > _milli(enforced):
        return f"{name} max limit to request ratio per {kind} is {enforced}, but provided ratio is {ratio:f}"
    return None


def _bounds(item: dict[str, Any]) -> tuple[q.ResourceList, q.ResourceList, q.ResourceList]:
    return q.parse_list(item.get("min")), q.parse_list(item.get("max")), q.parse_list(item.get("maxLimitRequestRatio"))


def _check(kind: str, item: dict[str, Any], requests: q.ResourceList, limits: q.ResourceList,
           errs: list[str]) -> None:
    mins, maxes, ratios = _bounds(item)
    for name in sorted(mins):
        if (e := min_constraint(kind, name, mins[name], requests, limits)) is not None:
            errs.append(e)
    for name in sorted(maxes):
        if (e := max_constraint(kind, name, maxes[name], requests, limits)) is not None:
            errs.append(e)
    for name in sorted(ratios):
        if (e := ratio_constraint(kind, name, ratios[name], requests, limits)) is not None:
            errs.append(e)


def pod_violations(pod: dict[str, Any], limit_range: dict[str, Any]) -> list[str]:
    """PodValidateLimitFunc: every Container / Pod bound the pod breaks."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    errs: list[str] = []
    for item in limit_items(limit_range):
        kind = item.get("type")
        if kind == LIMIT_TYPE_CONTAINER:
            for key in ("containers", "initContainers"):
                for c in spec.get(key) or []:
                    if isinstance(c, dict):
                        _check(kind, item, *q.container_resources(c), errs)
        elif kind == LIMIT_TYPE_POD:
            _check(kind, item, *q.pod_requests_limits(pod), errs)
    return errs


def claim_violations(pvc: dict[str, Any], limit_range: dict[str, Any]) -> list[str]:
    """PersistentVolumeClaimValidateLimitFunc: min/max of the storage request."""
    spec = pvc.get("spec") if isinstance(pvc.get("spec"), dict) else {}
    requests = q.parse_list(((spec.get("resources") or {}).get("requests")) if isinstance(
        spec.get("resources"), dict) else None)
    errs: list[str] = []
    for item in limit_items(limit_range):
        if item.get("type") != LIMIT_TYPE_PVC:
            continue
        mins, maxes, _ = _bounds(item)
        for name in sorted(mins):
            if (e := min_constraint(LIMIT_TYPE_PVC, name, mins[name], requests, {})) is not None:
                errs.append(e)
        for name in sorted(maxes):
            if (e := max_request_constraint(LIMIT_TYPE_PVC, name, maxes[name], requests)) is not None:
                errs.append(e)
    return errs


def aggregate(errs: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error(): one message as is, several as `[a, b]` (repeats dropped)."""
    uniq = list(dict.fromkeys(errs))
    return uniq[0] if len(uniq) == 1 else "[" + ", ".join(uniq) + "]"


# ---------------------------------------------------------------------------------------
# The plugin


class LimitRanger:
    """Mutating (pod defaults) and validating (bounds) admission plugin."""

    name = "LimitRanger"

    def __init__(self, store: Store, cache: NamespacedCache | None = None) -> None:
        self.store = store
        self.cache = cache

    async def limit_ranges(self, namespace: str) -> list[dict[str, Any]]:
        if self.cache is not None and self.cache.synced:
            return self.cache.in_namespace(namespace)
        return (await self.store.list(limit_ranges_prefix(namespace))).items

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        if (attrs.group, attrs.resource, attrs.subresource, attrs.verb) != ("", "pods", "", "create"):
            return obj
        ranges = await self.limit_ranges(attrs.namespace)
        changed = False
        for lr in sorted(ranges, key=lambda o: o["metadata"]["name"]):
            changed = apply_defaults(obj, lr) or changed
        status, spec = obj.get("status"), obj.get("spec")
        if changed and isinstance(status, dict) and isinstance(spec, dict):
            status["qosClass"] = qos_class(spec)
        return obj

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if obj is None or attrs.group != "" or attrs.subresource:
            return
        if attrs.resource == "pods":
            if attrs.verb != "create":
                return
            check = pod_violations
        elif attrs.resource == "persistentvolumeclaims":
            if attrs.verb not in ("create", "update", "patch"):
                return
            if old is not None and (old.get("metadata") or {}).get("deletionTimestamp"):
                return
            check = claim_violations
        else:
            return
        for lr in sorted(await self.limit_ranges(attrs.namespace), key=lambda o: o["metadata"]["name"]):
            errs = check(obj, lr)
            if errs:
                raise forbidden(attrs.resource, "", attrs.name, aggregate(errs))
