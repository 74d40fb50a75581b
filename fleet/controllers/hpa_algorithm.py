"""The HorizontalPodAutoscaler's arithmetic, as pure functions (no I/O, no clocks of its own).

Two stages, as in kube-controller-manager (pkg/controller/podautoscaler:
replica_calculator.go, horizontal.go), written here in our own words:

**1. A proposal per metric.**  For a resource metric (cpu, memory) the usage of
every pod the target's selector picks is compared with a target, either a
utilization of the pods' requests or an average value:

    ratio    = current / target
    proposal = ceil(ratio * ready pods)       unless |1 - ratio| <= tolerance (0.1):
                                              then the current replica count stands

Not every pod counts as measured:

* deleted and Failed pods are *ignored* (dropped from everything);
* Pending pods, and for cpu pods that are not ready or still in their first
  minutes (`cpu_initialization_period`, 5 min) and not yet measured over a
  full window since they became ready, are *unready*: left out of the first
  ratio, and when that ratio says "scale up" they are put back as using 0 —
  a pod still starting (and burning cpu to start) must not cause a scale-up;
* running pods without a metric are *missing*: on a scale-down they are
  assumed to use 100% of their request (or the target, if higher), on a
  scale-up 0%, so the guess always dampens the move.

If putting unready and missing pods back flips the direction or lands within
the tolerance, nothing changes.  The HPA takes the largest proposal over its
metrics.

**2. Normalization over time.**  Without `spec.behavior` the legacy rules
apply: the highest recommendation of the last `downscale_stabilization`
(5 min) wins, and a step up is at most max(2 x current, 4).  With
`behavior`, recommendations are stabilized per direction (scale up takes the
lowest of its window, default 0 s; scale down the highest of its window,
default 5 min), then the rate policies bound the change: per policy, the
replicas at the start of its period (`current - added + removed` in the last
`periodSeconds`) plus `value` pods or percent; `selectPolicy` Max takes the
policy allowing the biggest change, Min the smallest, Disabled none.  Both
end within [minReplicas, maxReplicas].

Every decision reports the condition it implies (AbleToScale,
ScalingLimited) with kube-controller-manager's reasons and messages, so
`kubectl describe hpa` reads the same.  Times: `now` for windows is the
controller's monotonic Trio clock (so tests run under MockClock); `wall` for
pod readiness is the wall clock, because pod timestamps are wall-clock times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fleet.api import meta, quantity
from fleet.api.conditions import pod_ready_condition, set_status_condition

TOLERANCE = 0.1
CPU_INITIALIZATION_PERIOD = 300.0  # --horizontal-pod-autoscaler-cpu-initialization-period
INITIAL_READINESS_DELAY = 30.0  # --horizontal-pod-autoscaler-initial-readiness-delay
DOWNSCALE_STABILIZATION = 300.0  # --horizontal-pod-autoscaler-downscale-stabilization
SCALE_UP_LIMIT_FACTOR = 2
SCALE_UP_LIMIT_MINIMUM = 4


class MetricError(Exception):
    """A metric could not give a proposal (no metrics, no pods, a missing request...)."""


@dataclass(frozen=True)
class PodMetric:
    value: int  # milli-units of the resource (millicores, millibytes), as Quantity.MilliValue()
    timestamp: float = 0.0  # wall-clock seconds
    window: float = 0.0  # seconds


PodMetrics = dict[str, PodMetric]


# ---------------------------------------------------------------------------------------
# Reading the metrics API


_ts = meta.parse_epoch


def _window(value: Any) -> float:
    from fleet.api.kinds.metrics import parse_duration

    try:
        return parse_duration(value)
    except ValueError:
        return 0.0


def milli(value: Any) -> int | None:
    """A quantity in milli-units, rounded up (Quantity.MilliValue()); None if it is not one."""
    try:
        return quantity.milli_value(value)
    except (quantity.QuantityError, TypeError):
        return None


def pod_metrics_from_api(items: list[dict[str, Any]], resource: str,
                         container: str = "") -> PodMetrics:
    """Pod name -> usage from a PodMetricsList (the HPA's resource metrics client).

    Without `container` a pod's value is the sum over its containers, and a
    pod with a container lacking the resource is left out (missing); with
    `container` only that container counts, and a pod without it is an error.
    """
    if not items:
        raise MetricError("no metrics returned from resource metrics API")
    out: PodMetrics = {}
    for m in items:
        md = m.get("metadata") or {}
        name = str(md.get("name", ""))
        ts, window = _ts(m.get("timestamp")) or 0.0, _window(m.get("window"))
        containers = [c for c in m.get("containers") or [] if isinstance(c, dict)]
        if container:
            found = next((c for c in containers if c.get("name") == container), None)
            if found is None:
                raise MetricError(f"failed to get container metrics: container {container} not "
                                  f"present in metrics for pod {md.get('namespace', '')}/{name}")
            value = milli((found.get("usage") or {}).get(resource))
            if value is not None:
                out[name] = PodMetric(value, ts, window)
            continue
        total, missing = 0, not containers
        for c in containers:
            value = milli((c.get("usage") or {}).get(resource))
            if value is None:
                missing = True
                break
            total += value
        if not missing:
            out[name] = PodMetric(total, ts, window)
    return out


# ---------------------------------------------------------------------------------------
# Stage 1: a proposal per metric


@dataclass
class PodGroups:
    ready: int = 0
    unready: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    ignored: set[str] = field(default_factory=set)


def group_pods(pods: list[dict[str, Any]], metrics: PodMetrics, resource: str, wall: float, *,
               cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
               initial_readiness_delay: float = INITIAL_READINESS_DELAY) -> PodGroups:
    """Sort the selected pods into ready-and-measured, unready, missing and ignored."""
    g = PodGroups()
    for pod in pods:
        md = pod.get("metadata") or {}
        status = pod.get("status") or {}
        name = str(md.get("name", ""))
        if md.get("deletionTimestamp") or status.get("phase") == "Failed":
            g.ignored.add(name)
            continue
        if status.get("phase") == "Pending":
            g.unready.add(name)
            continue
        metric = metrics.get(name)
        if metric is None:
            g.missing.add(name)
            continue
        if resource == "cpu":
            cond = pod_ready_condition(pod)
            start = _ts(status.get("startTime"))
            if cond is None or start is None:
                unready = True
            else:
                changed = _ts(cond.get("lastTransitionTime")) or 0.0
                if start + cpu_initialization_period > wall:
                    # Still starting up: count it only once it is ready and a full
                    # window of usage was measured after it became so.
                    unready = cond.get("status") == "False" or \
                        metric.timestamp < changed + metric.window
                else:
                    # Long running: unready only if it never was ready since it started.
                    unready = cond.get("status") == "False" and \
                        start + initial_readiness_delay > changed
            if unready:
                g.unready.add(name)
                continue
        g.ready += 1
    return g


def pod_requests(pods: list[dict[str, Any]], resource: str, container: str = "") -> dict[str, int]:
    """Pod name -> the pod's request of `resource` in milli-units (only `container`'s, if given).

    A container without a request makes utilization meaningless: MetricError,
    as in Kubernetes (average value targets do not need requests)."""
    out: dict[str, int] = {}
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", ""))
        total = 0
        for c in (pod.get("spec") or {}).get("containers") or []:
            if not isinstance(c, dict) or (container and c.get("name") != container):
                continue
            req = ((c.get("resources") or {}).get("requests") or {}).get(resource)
            value = milli(req) if req is not None else None
            if value is None:
                raise MetricError(f"missing request for {resource} in container "
                                  f"{c.get('name', '')} of Pod {name}")
            total += value
        out[name] = total
    return out


def resource_utilization_ratio(metrics: PodMetrics, requests: dict[str, int],
                               target_utilization: int) -> tuple[float, int, int]:
    """(usage / target, utilization % of requests, average raw usage in milli-units)."""
    used = requested = n = 0
    for name, m in metrics.items():
        if name not in requests:
            continue
        used += m.value
        requested += requests[name]
        n += 1
    if requested == 0:
        raise MetricError("no metrics returned matched known pods")
    utilization = used * 100 // requested
    return utilization / target_utilization, utilization, used // n


def metric_usage_ratio(metrics: PodMetrics, target_usage: int) -> tuple[float, int]:
    """(average usage / target, average usage) for an average-value target."""
    usage = sum(m.value for m in metrics.values()) // len(metrics)
    return usage / target_usage, usage


def _adjusted(current: int, ratio: float, groups: PodGroups, metrics: PodMetrics,
              fill_missing_down: dict[str, int], recompute: Any, tolerance: float) -> int:
    """Put unready and missing pods back (the dampening guesses) and decide again."""
    scale_up_with_unready = bool(groups.unready) and ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * groups.ready)
    filled = dict(metrics)
    if groups.missing:
        if ratio < 1.0:
            for name in groups.missing:
                filled[name] = PodMetric(fill_missing_down.get(name, 0))
        elif ratio > 1.0:
            for name in groups.missing:
                filled[name] = PodMetric(0)
    if scale_up_with_unready:
        for name in groups.unready:
            filled[name] = PodMetric(0)
    new_ratio = recompute(filled)
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current  # too small a change, or the guesses flipped the direction
    proposal = math.ceil(new_ratio * len(filled))
    if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
        return current  # counting more pods would move against the ratio
    return proposal


def _measured(pods: list[dict[str, Any]], metrics: PodMetrics, resource: str, wall: float,
              **timing: float) -> tuple[PodGroups, PodMetrics]:
    if not pods:
        raise MetricError("no pods returned by selector while calculating replica count")
    groups = group_pods(pods, metrics, resource, wall, **timing)
    kept = {n: m for n, m in metrics.items() if n not in groups.ignored and n not in groups.unready}
    if not kept:
        raise MetricError("did not receive metrics for targeted pods (pods might be unready)")
    return groups, kept


def resource_replicas(current: int, target_utilization: int, resource: str,
                      pods: list[dict[str, Any]], metrics: PodMetrics, wall: float, *,
                      container: str = "", tolerance: float = TOLERANCE,
                      **timing: float) -> tuple[int, int, int]:
    """(proposal, utilization %, average raw usage) for a Utilization target."""
    groups, kept = _measured(pods, metrics, resource, wall, **timing)
    requests = pod_requests(pods, resource, container)
    ratio, utilization, raw = resource_utilization_ratio(kept, requests, target_utilization)
    # Missing pods on a scale-down: their whole request, or the target when it is above 100%.
    fallback = max(100, target_utilization)
    fill = {n: requests.get(n, 0) * fallback // 100 for n in groups.missing}
    proposal = _adjusted(current, ratio, groups, kept, fill,
                         lambda m: resource_utilization_ratio(m, requests, target_utilization)[0],
                         tolerance)
    return proposal, utilization, raw


def raw_resource_replicas(current: int, target_value: int, resource: str,
                          pods: list[dict[str, Any]], metrics: PodMetrics, wall: float, *,
                          tolerance: float = TOLERANCE, **timing: float) -> tuple[int, int]:
    """(proposal, average usage) for an AverageValue target (milli-units)."""
    groups, kept = _measured(pods, metrics, resource, wall, **timing)
    ratio, usage = metric_usage_ratio(kept, target_value)
    fill = dict.fromkeys(groups.missing, target_value)
    proposal = _adjusted(current, ratio, groups, kept, fill,
                         lambda m: metric_usage_ratio(m, target_value)[0], tolerance)
    return proposal, usage


# ---------------------------------------------------------------------------------------
# Stage 2: normalization over time


@dataclass
class Recommendation:
    replicas: int
    at: float


@dataclass
class ScaleEvent:
    change: int  # replicas added (scale up) or removed (scale down), positive
    at: float
    outdated: bool = False


@dataclass
class History:
    """What the controller remembers of one HPA between syncs (in memory, as in Kubernetes)."""

    recommendations: list[Recommendation] = field(default_factory=list)
    scale_up: list[ScaleEvent] = field(default_factory=list)
    scale_down: list[ScaleEvent] = field(default_factory=list)


# (condition type, status, reason, message)
Condition = tuple[str, str, str, str]

_WITHIN = ("DesiredWithinRange", "the desired count is within the acceptable range")


def record_initial_recommendation(h: History, current: int, now: float) -> None:
    if not h.recommendations:
        h.recommendations.append(Recommendation(current, now))


def _record(h: History, replicas: int, now: float, old_index: int | None) -> None:
    # Reuse one expired slot rather than growing the list: it stays as long as a window.
    if old_index is not None:
        h.recommendations[old_index] = Recommendation(replicas, now)
    else:
        h.recommendations.append(Recommendation(replicas, now))


def stabilize_legacy(h: History, desired: int, now: float, window: float) -> int:
    """The highest recommendation of the last `window` seconds (this one included)."""
    cutoff = now - window
    best, old = desired, None
    for i, r in enumerate(h.recommendations):
        if r.at < cutoff:
            old = i
        elif r.replicas > best:
            best = r.replicas
    _record(h, desired, now, old)
    return best


def scale_up_limit_legacy(current: int) -> int:
    return max(SCALE_UP_LIMIT_FACTOR * current, SCALE_UP_LIMIT_MINIMUM)


def limit_legacy(current: int, desired: int, min_replicas: int,
                 max_replicas: int) -> tuple[int, str, str]:
    """Bound `desired` by [min, max] and the legacy scale-up rate."""
    up_limit = scale_up_limit_legacy(current)
    if max_replicas > up_limit:
        upper, reason, msg = up_limit, "ScaleUpLimit", \
            "the desired replica count is increasing faster than the maximum scale rate"
    else:
        upper, reason, msg = max_replicas, "TooManyReplicas", \
            "the desired replica count is more than the maximum replica count"
    if desired < min_replicas:
        return min_replicas, "TooFewReplicas", \
            "the desired replica count is less than the minimum replica count"
    if desired > upper:
        return upper, reason, msg
    return desired, *_WITHIN


def normalize_legacy(h: History, current: int, desired: int, min_replicas: int, max_replicas: int,
                     now: float, window: float = DOWNSCALE_STABILIZATION
                     ) -> tuple[int, list[Condition]]:
    """An HPA without `behavior`: stabilize downscales, bound the step (normalizeDesiredReplicas)."""
    stabilized = stabilize_legacy(h, desired, now, window)
    conds: list[Condition] = []
    if stabilized != desired:
        conds.append(("AbleToScale", "True", "ScaleDownStabilized",
                      "recent recommendations were higher than current one, applying the "
                      "highest recent recommendation"))
    else:
        conds.append(("AbleToScale", "True", "ReadyForNewScale",
                      "recommended size matches current size"))
    final, reason, msg = limit_legacy(current, stabilized, min_replicas, max_replicas)
    conds.append(("ScalingLimited", "False" if final == stabilized else "True", reason, msg))
    return final, conds


def stabilize_with_behavior(h: History, current: int, desired: int, up_window: float,
                            down_window: float, now: float) -> tuple[int, str, str]:
    """Keep the recommendation within the lowest of the scale-up window and the highest of
    the scale-down window (stabilizeRecommendationWithBehaviors)."""
    up_cutoff, down_cutoff = now - up_window, now - down_window
    up, down, old = desired, desired, None
    for i, r in enumerate(h.recommendations):
        if r.at > up_cutoff:
            up = min(up, r.replicas)
        if r.at > down_cutoff:
            down = max(down, r.replicas)
        if r.at < up_cutoff and r.at < down_cutoff:
            old = i
    recommendation = min(max(current, up), down)
    _record(h, desired, now, old)
    if desired >= current:
        return recommendation, "ScaleUpStabilized", \
            "recent recommendations were lower than current one, applying the lowest recent " \
            "recommendation"
    return recommendation, "ScaleDownStabilized", \
        "recent recommendations were higher than current one, applying the highest recent " \
        "recommendation"


def change_in_period(period: float, events: list[ScaleEvent], now: float) -> int:
    cutoff = now - period
    return sum(e.change for e in events if e.at > cutoff)


def scale_up_limit(current: int, up: list[ScaleEvent], down: list[ScaleEvent],
                   rules: dict[str, Any], now: float) -> int:
    """The most replicas the scale-up policies allow now."""
    select = rules.get("selectPolicy") or "Max"
    if select == "Disabled":
        return current
    result: int | None = None
    for p in rules.get("policies") or []:
        period = p.get("periodSeconds", 0)
        start = current - change_in_period(period, up, now) + change_in_period(period, down, now)
        if p.get("type") == "Pods":
            proposed = start + int(p.get("value", 0))
        else:
            # Rounded up: a small percentage of few pods must still allow one more.
            proposed = math.ceil(start * (1 + int(p.get("value", 0)) / 100))
        if result is None:
            result = proposed
        else:
            result = min(result, proposed) if select == "Min" else max(result, proposed)
    return current if result is None else result


def scale_down_limit(current: int, up: list[ScaleEvent], down: list[ScaleEvent],
                     rules: dict[str, Any], now: float) -> int:
    """The fewest replicas the scale-down policies allow now."""
    select = rules.get("selectPolicy") or "Max"
    if select == "Disabled":
        return current
    result: int | None = None
    for p in rules.get("policies") or []:
        period = p.get("periodSeconds", 0)
        start = current - change_in_period(period, up, now) + change_in_period(period, down, now)
        if p.get("type") == "Pods":
            proposed = start - int(p.get("value", 0))
        else:
            proposed = int(start * (1 - int(p.get("value", 0)) / 100))
        if result is None:
            result = proposed
        else:
            # "Max" is the biggest change, i.e. the fewest replicas.
            result = max(result, proposed) if select == "Min" else min(result, proposed)
    return current if result is None else result


def limit_by_behavior(h: History, current: int, desired: int, min_replicas: int,
                      max_replicas: int, up_rules: dict[str, Any], down_rules: dict[str, Any],
                      now: float) -> tuple[int, str, str]:
    """Bound `desired` by [min, max] and the rate policies (convertDesiredReplicasWithBehaviorRate)."""
    if desired > current:
        limit = max(scale_up_limit(current, h.scale_up, h.scale_down, up_rules, now), current)
        if max_replicas > limit:
            upper, reason, msg = limit, "ScaleUpLimit", \
                "the desired replica count is increasing faster than the maximum scale rate"
        else:
            upper, reason, msg = max_replicas, "TooManyReplicas", \
                "the desired replica count is more than the maximum replica count"
        if desired > upper:
            return upper, reason, msg
    elif desired < current:
        limit = min(scale_down_limit(current, h.scale_up, h.scale_down, down_rules, now), current)
        if min_replicas < limit:
            lower, reason, msg = limit, "ScaleDownLimit", \
                "the desired replica count is decreasing faster than the maximum scale rate"
        else:
            lower, reason, msg = min_replicas, "TooFewReplicas", \
                "the desired replica count is less than the minimum replica count"
        if desired < lower:
            return lower, reason, msg
    return desired, *_WITHIN


def normalize_with_behavior(h: History, current: int, desired: int, min_replicas: int,
                            max_replicas: int, behavior: dict[str, Any], now: float,
                            default_down_window: float = DOWNSCALE_STABILIZATION
                            ) -> tuple[int, list[Condition]]:
    """An HPA with `behavior` (normalizeDesiredReplicasWithBehaviors)."""
    up_rules = behavior.get("scaleUp") or {}
    down_rules = behavior.get("scaleDown") or {}
    up_window = up_rules.get("stabilizationWindowSeconds")
    down_window = down_rules.get("stabilizationWindowSeconds")
    stabilized, reason, msg = stabilize_with_behavior(
        h, current, desired, float(up_window or 0),
        float(default_down_window if down_window is None else down_window), now)
    conds: list[Condition] = []
    if stabilized != desired:
        conds.append(("AbleToScale", "True", reason, msg))
    else:
        conds.append(("AbleToScale", "True", "ReadyForNewScale",
                      "recommended size matches current size"))
    final, reason, msg = limit_by_behavior(h, current, stabilized, min_replicas, max_replicas,
                                           up_rules, down_rules, now)
    conds.append(("ScalingLimited", "False" if final == stabilized else "True", reason, msg))
    return final, conds


def _longest_period(rules: dict[str, Any]) -> int:
    return max((int(p.get("periodSeconds", 0)) for p in rules.get("policies") or []), default=0)


def store_scale_event(h: History, behavior: dict[str, Any] | None, previous: int, new: int,
                      now: float) -> None:
    """Remember a rescale for the rate policies (only HPAs with `behavior` use them)."""
    if behavior is None or new == previous:
        return
    if new > previous:
        events, rules, change = h.scale_up, behavior.get("scaleUp") or {}, new - previous
    else:
        events, rules, change = h.scale_down, behavior.get("scaleDown") or {}, previous - new
    cutoff = now - _longest_period(rules)
    slot = None
    for i, e in enumerate(events):
        if e.at < cutoff:
            e.outdated = True
            slot = i
    if slot is not None:
        events[slot] = ScaleEvent(change, now)
    else:
        events.append(ScaleEvent(change, now))


# ---------------------------------------------------------------------------------------
# Conditions


def set_condition(conditions: list[dict[str, Any]], ctype: str, status: str, reason: str,
                  message: str, now: str) -> list[dict[str, Any]]:
    """`conditions` with one condition set (meta.SetStatusCondition, no observedGeneration)."""
    return set_status_condition(conditions, ctype, status, reason, message, now)


__all__ = [
    "CPU_INITIALIZATION_PERIOD", "DOWNSCALE_STABILIZATION", "INITIAL_READINESS_DELAY", "TOLERANCE",
    "Condition", "History", "MetricError", "PodGroups", "PodMetric", "PodMetrics",
    "Recommendation", "ScaleEvent", "change_in_period", "group_pods", "limit_by_behavior",
    "limit_legacy", "metric_usage_ratio", "milli", "normalize_legacy", "normalize_with_behavior",
    "pod_metrics_from_api", "pod_requests", "raw_resource_replicas",
    "record_initial_recommendation", "resource_replicas", "resource_utilization_ratio",
    "scale_down_limit", "scale_up_limit", "set_condition", "stabilize_legacy",
    "stabilize_with_behavior", "store_scale_event",
]
