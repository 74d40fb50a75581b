"""The HPA's arithmetic (fleet/controllers/hpa_algorithm.py) — pure, table-driven.

Stage 1 cases follow the situations of kube-controller-manager's
replica_calculator tests (scale up/down, tolerance, unready and missing pods,
ignored pods, container metrics, average values); stage 2 walks stabilization
windows and rate policies through explicit times.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fleet.controllers import hpa_algorithm as alg
from fleet.controllers.hpa_algorithm import (
    History,
    MetricError,
    PodMetric,
    Recommendation,
    ScaleEvent,
)

WALL = 1_800_000_000.0


def ts(seconds_ago: float) -> str:
    return datetime.fromtimestamp(WALL - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, phase: str = "Running", ready: bool | None = True, started_ago: float = 600,
        ready_changed_ago: float | None = None, cpu: str | None = "1", memory: str | None = "1Gi",
        deleting: bool = False, containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {"app": "web"}}
    if deleting:
        md["deletionTimestamp"] = ts(0)
    status: dict[str, Any] = {"phase": phase, "startTime": ts(started_ago)}
    if ready is not None:
        changed = started_ago - 5 if ready_changed_ago is None else ready_changed_ago
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False",
                                 "lastTransitionTime": ts(changed)}]
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"metadata": md, "spec": {"containers": containers or [
        {"name": "app", "resources": {"requests": requests}}]}, "status": status}


def measured(**values: int) -> dict[str, PodMetric]:
    """Metrics taken a moment ago over a 15 s window."""
    return {name: PodMetric(v, WALL - 1, 15.0) for name, v in values.items()}


# ---------------------------------------------------------------------------------------
# Utilization targets


@pytest.mark.parametrize(("case", "current", "target", "pods", "metrics", "want", "util"), [
    ("scale up", 3, 30, [pod("a"), pod("b"), pod("c")],
     measured(a=300, b=500, c=700), 5, 50),
    ("scale down", 5, 50, [pod(n) for n in "abcde"],
     measured(a=100, b=300, c=500, d=250, e=250), 3, 28),
    ("within tolerance", 3, 100,
     [pod("a", cpu="900m"), pod("b", cpu="1"), pod("c", cpu="1100m")],
     measured(a=1010, b=1030, c=1020), 3, 102),
    ("just outside tolerance", 4, 100, [pod(n) for n in "abcd"],
     measured(a=1120, b=1120, c=1120, d=1120), 5, 112),
    # A pod not ready yet is left out, then counted at 0 because the ratio says up:
    # 60% of 2 pods becomes 40% of 3 -> 4 instead of 4 (ceil(2*3)=6 without the rule).
    ("unready pod dampens a scale up", 3, 30,
     [pod("a", ready=False, started_ago=20), pod("b"), pod("c")],
     measured(a=300, b=500, c=700), 4, 60),
    # ... but on the way down it is simply left out.
    ("unready pod ignored on a scale down", 3, 50,
     [pod("a", ready=False, started_ago=20), pod("b"), pod("c")],
     measured(a=900, b=100, c=100), 1, 10),
    ("pending pod counts as unready", 2, 50, [pod("a"), pod("b", phase="Pending", ready=None)],
     measured(a=1000), 2, 100),
    ("failed and deleted pods are ignored", 1, 50,
     [pod("a"), pod("f", phase="Failed"), pod("d", deleting=True)],
     measured(a=1000, f=0, d=0), 2, 100),
    # Missing metrics on a scale down count as 100% of the request: 40% of 3 pods and
    # 100% of one make 55%, which would be a scale up -> nothing changes.
    ("missing pod flips a scale down", 4, 50, [pod(n) for n in "abcd"],
     measured(a=400, b=400, c=400), 4, 40),
    # ... and on a scale up as 0%: 90% of 3 and 0% of 1 make 67% of 4 -> 6.
    ("missing pod dampens a scale up", 4, 50, [pod(n) for n in "abcd"],
     measured(a=900, b=900, c=900), 6, 90),
    # Above a 100% target the missing pods count as the target itself: 10% of 2 pods and
    # 200% of one make 73% of 3 against 200% -> 2.
    ("missing pod with a target above 100%", 3, 200, [pod(n) for n in "abc"],
     measured(a=100, b=100), 2, 10),
    # A pod just started is not counted until a full window was measured after it
    # became ready (its start burns cpu): 200% of one pod becomes 100% of two -> no change.
    ("fresh pod without a full window", 2, 50,
     [pod("a"), pod("b", started_ago=8, ready_changed_ago=2)],
     measured(a=1000, b=1000), 2, 100),
    # Long running and once ready, a pod that is not ready now still counts for cpu.
    ("long running pod that was ready", 2, 50,
     [pod("a"), pod("b", ready=False, started_ago=900, ready_changed_ago=60)],
     measured(a=1000, b=1000), 4, 100),
])
def test_resource_replicas(case, current, target, pods, metrics, want, util):
    replicas, utilization, _ = alg.resource_replicas(current, target, "cpu", pods, metrics, WALL)
    assert (replicas, utilization) == (want, util), case


def test_unready_rules_apply_to_cpu_only():
    pods = [pod("a"), pod("b", ready=False, started_ago=20)]
    metrics = measured(a=1000, b=1000)
    cpu = alg.group_pods(pods, metrics, "cpu", WALL)
    mem = alg.group_pods(pods, metrics, "memory", WALL)
    assert (cpu.ready, cpu.unready) == (1, {"b"})
    assert (mem.ready, mem.unready) == (2, set())


def test_never_ready_long_running_pod_is_unready():
    # Not ready since 5 s after its start (inside the 30 s readiness delay): never was ready.
    groups = alg.group_pods([pod("a", ready=False, started_ago=900, ready_changed_ago=895)],
                            measured(a=1), "cpu", WALL)
    assert groups.unready == {"a"}


def test_raw_usage_is_the_average():
    assert alg.resource_replicas(2, 50, "cpu", [pod("a"), pod("b")], measured(a=200, b=400),
                                 WALL)[2] == 300


def test_container_resource_uses_that_container_only():
    containers = [{"name": "app", "resources": {"requests": {"cpu": "500m"}}},
                  {"name": "sidecar", "resources": {"requests": {"cpu": "1500m"}}}]
    pods = [pod("a", containers=containers), pod("b", containers=containers)]
    # Usage of `app` only: 500m of 500m is 100%, against 50% -> 4.
    replicas, util, _ = alg.resource_replicas(2, 50, "cpu", pods, measured(a=500, b=500), WALL,
                                              container="app")
    assert (replicas, util) == (4, 100)


@pytest.mark.parametrize(("pods", "metrics", "message"), [
    ([], measured(a=1), "no pods returned by selector"),
    ([pod("a", ready=False, started_ago=20)], measured(a=1), "did not receive metrics"),
    ([pod("a", cpu=None)], measured(a=1), "missing request for cpu in container app of Pod a"),
])
def test_resource_replicas_errors(pods, metrics, message):
    with pytest.raises(MetricError, match=message):
        alg.resource_replicas(1, 50, "cpu", pods, metrics, WALL)


# ---------------------------------------------------------------------------------------
# Average value targets


@pytest.mark.parametrize(("current", "target", "metrics", "want", "usage"), [
    (2, 200, measured(a=300, b=300), 3, 300),
    (4, 200, measured(a=100, b=100, c=100, d=100), 2, 100),
    (2, 300, measured(a=310, b=300), 2, 305),  # within tolerance
])
def test_raw_resource_replicas(current, target, metrics, want, usage):
    pods = [pod(n) for n in metrics]
    assert alg.raw_resource_replicas(current, target, "cpu", pods, metrics, WALL) == (want, usage)


def test_raw_resource_missing_pods_count_as_the_target_on_a_scale_down():
    # 100 average of 2 measured, the missing one at the target (200): 133 of 200 -> still down,
    # ceil(0.665 * 3) = 2.
    pods = [pod("a"), pod("b"), pod("c")]
    assert alg.raw_resource_replicas(3, 200, "cpu", pods, measured(a=100, b=100), WALL)[0] == 2


# ---------------------------------------------------------------------------------------
# Reading PodMetrics


def pm(name: str, *containers: tuple[str, dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "timestamp": ts(2), "window": "15s",
            "containers": [{"name": n, "usage": u} for n, u in containers]}


def test_pod_metrics_from_api_sums_containers_in_milli_units():
    items = [pm("a", ("app", {"cpu": "250m", "memory": "1Ki"}), ("side", {"cpu": "1500001n",
                                                                          "memory": "1Ki"})),
             pm("b", ("app", {"memory": "2Ki"})),  # no cpu: left out (missing)
             pm("c")]  # no containers: missing
    cpu = alg.pod_metrics_from_api(items, "cpu")
    assert cpu == {"a": PodMetric(252, WALL - 2, 15.0)}  # 1500001n rounds up to 2m
    mem = alg.pod_metrics_from_api(items, "memory")
    assert mem["a"].value == 2048 * 1000 and mem["b"].value == 2048 * 1000


def test_pod_metrics_from_api_container_mode():
    items = [pm("a", ("app", {"cpu": "100m"}), ("side", {"cpu": "900m"}))]
    assert alg.pod_metrics_from_api(items, "cpu", "side")["a"].value == 900
    with pytest.raises(MetricError, match="container web not present in metrics for pod ns/a"):
        alg.pod_metrics_from_api(items, "cpu", "web")
    with pytest.raises(MetricError, match="no metrics returned"):
        alg.pod_metrics_from_api([], "cpu")


# ---------------------------------------------------------------------------------------
# Stage 2: without behavior


@pytest.mark.parametrize(("current", "desired", "lo", "hi", "want", "reason"), [
    (1, 10, 1, 20, 4, "ScaleUpLimit"),  # at most max(2 x 1, 4)
    (5, 20, 1, 8, 8, "TooManyReplicas"),
    (5, 9, 1, 20, 9, "DesiredWithinRange"),
    (5, 0, 2, 20, 2, "TooFewReplicas"),
    (10, 30, 1, 50, 20, "ScaleUpLimit"),  # 2 x 10
])
def test_limit_legacy(current, desired, lo, hi, want, reason):
    assert alg.limit_legacy(current, desired, lo, hi)[:2] == (want, reason)


def test_legacy_downscale_stabilization_window():
    h = History()
    alg.record_initial_recommendation(h, 5, now=0)
    # Load drops at t=10: the 5 seen within the window keeps the replicas up...
    got, conds = alg.normalize_legacy(h, 5, 2, 1, 10, now=10, window=300)
    assert got == 5
    assert conds[0][:3] == ("AbleToScale", "True", "ScaleDownStabilized")
    assert conds[1][:3] == ("ScalingLimited", "False", "DesiredWithinRange")
    # ... until it is older than the window.
    got, conds = alg.normalize_legacy(h, 5, 2, 1, 10, now=301, window=300)
    assert got == 2
    assert conds[0][2] == "ReadyForNewScale"
    assert conds[1][:2] == ("ScalingLimited", "False")


def test_stabilize_legacy_reuses_expired_slots():
    h = History([Recommendation(3, 0), Recommendation(4, 100)])
    assert alg.stabilize_legacy(h, 2, now=350, window=300) == 4
    assert h.recommendations == [Recommendation(2, 350), Recommendation(4, 100)]


# ---------------------------------------------------------------------------------------
# Stage 2: with behavior

DEFAULT_UP = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
              "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                           {"type": "Percent", "value": 100, "periodSeconds": 15}]}
DEFAULT_DOWN = {"selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100,
                                                     "periodSeconds": 15}]}


def events(*changes: tuple[int, float]) -> list[ScaleEvent]:
    return [ScaleEvent(c, at) for c, at in changes]


@pytest.mark.parametrize(("case", "current", "rules", "up", "down", "now", "want"), [
    ("max of +4 and +100%", 3, DEFAULT_UP, [], [], 100, 7),
    ("max of +4 and +100% (big)", 10, DEFAULT_UP, [], [], 100, 20),
    ("min policy", 10, {**DEFAULT_UP, "selectPolicy": "Min"}, [], [], 100, 14),
    ("disabled", 10, {**DEFAULT_UP, "selectPolicy": "Disabled"}, [], [], 100, 10),
    # 4 added 10 s ago: the period started at 3, so 3+4 and 2x3 -> 7 (no room above 7).
    ("within the period", 7, DEFAULT_UP, events((4, 90)), [], 100, 7),
    ("period over", 7, DEFAULT_UP, events((4, 80)), [], 100, 14),
    # A scale down in the period raises the start: 5 now, 2 removed 5 s ago -> start 7.
    ("removals count back", 5, DEFAULT_UP, [], events((2, 95)), 100, 14),
    ("percent rounds up", 1, {"policies": [{"type": "Percent", "value": 10,
                                            "periodSeconds": 60}]}, [], [], 100, 2),
])
def test_scale_up_limit(case, current, rules, up, down, now, want):
    assert alg.scale_up_limit(current, up, down, rules, now) == want, case


@pytest.mark.parametrize(("case", "current", "rules", "up", "down", "now", "want"), [
    ("100% per 15 s", 10, DEFAULT_DOWN, [], [], 100, 0),
    ("half per minute", 10, {"policies": [{"type": "Percent", "value": 50,
                                           "periodSeconds": 60}]}, [], [], 100, 5),
    ("half per minute, used up", 5, {"policies": [{"type": "Percent", "value": 50,
                                                   "periodSeconds": 60}]}, [],
     events((5, 70)), 100, 5),
    ("max change wins", 10, {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60},
                                          {"type": "Percent", "value": 20,
                                           "periodSeconds": 60}]}, [], [], 100, 8),
    ("min change wins", 10, {"selectPolicy": "Min",
                             "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60},
                                          {"type": "Percent", "value": 20,
                                           "periodSeconds": 60}]}, [], [], 100, 9),
    ("disabled", 10, {**DEFAULT_DOWN, "selectPolicy": "Disabled"}, [], [], 100, 10),
])
def test_scale_down_limit(case, current, rules, up, down, now, want):
    assert alg.scale_down_limit(current, up, down, rules, now) == want, case


def test_behavior_scale_up_is_rate_limited_then_continues():
    behavior = {"scaleUp": DEFAULT_UP, "scaleDown": DEFAULT_DOWN}
    h = History()
    alg.record_initial_recommendation(h, 2, now=0)
    got, conds = alg.normalize_with_behavior(h, 2, 30, 1, 50, behavior, now=1)
    assert got == 6  # max(2 + 4, 2 x 2)
    assert conds[1][:3] == ("ScalingLimited", "True", "ScaleUpLimit")
    alg.store_scale_event(h, behavior, 2, 6, now=1)
    # 10 s later the period still holds the +4: no room.
    assert alg.normalize_with_behavior(h, 6, 30, 1, 50, behavior, now=11)[0] == 6
    # After the period: up to 12 (2 x 6), then the maximum.
    assert alg.normalize_with_behavior(h, 6, 30, 1, 50, behavior, now=17)[0] == 12
    got, conds = alg.normalize_with_behavior(h, 12, 60, 1, 20, behavior, now=40)
    assert got == 20 and conds[1][2] == "TooManyReplicas"


def test_behavior_scale_down_stabilization_window():
    behavior = {"scaleUp": DEFAULT_UP, "scaleDown": {**DEFAULT_DOWN,
                                                     "stabilizationWindowSeconds": 60}}
    h = History()
    alg.record_initial_recommendation(h, 8, now=0)
    assert alg.normalize_with_behavior(h, 8, 8, 1, 10, behavior, now=1)[0] == 8
    # Load gone at t=10: held at 8 for the window after the last recommendation of 8.
    got, conds = alg.normalize_with_behavior(h, 8, 2, 1, 10, behavior, now=10)
    assert got == 8 and conds[0][:3] == ("AbleToScale", "True", "ScaleDownStabilized")
    assert alg.normalize_with_behavior(h, 8, 2, 1, 10, behavior, now=60)[0] == 8
    got, conds = alg.normalize_with_behavior(h, 8, 2, 1, 10, behavior, now=62)
    assert got == 2 and conds[0][2] == "ReadyForNewScale" and conds[1][1] == "False"


def test_behavior_default_scale_down_window_comes_from_the_controller():
    # No stabilizationWindowSeconds in scaleDown: the controller's default (here 30 s).
    behavior = {"scaleUp": DEFAULT_UP, "scaleDown": DEFAULT_DOWN}
    h = History([Recommendation(6, 0)])
    assert alg.normalize_with_behavior(h, 6, 1, 1, 10, behavior, now=20,
                                       default_down_window=30)[0] == 6
    assert alg.normalize_with_behavior(h, 6, 1, 1, 10, behavior, now=51,
                                       default_down_window=30)[0] == 1


def test_behavior_scale_up_stabilization_window():
    behavior = {"scaleUp": {**DEFAULT_UP, "stabilizationWindowSeconds": 30},
                "scaleDown": {**DEFAULT_DOWN, "stabilizationWindowSeconds": 0}}
    h = History()
    alg.record_initial_recommendation(h, 2, now=0)
    # A spike at t=10 is not followed while a lower recommendation is within 30 s.
    got, conds = alg.normalize_with_behavior(h, 2, 8, 1, 10, behavior, now=10)
    assert got == 2 and conds[0][:3] == ("AbleToScale", "True", "ScaleUpStabilized")
    # Sustained: once every recommendation in the window asks for 8, it goes (rate-limited).
    alg.normalize_with_behavior(h, 2, 8, 1, 10, behavior, now=20)
    got, _ = alg.normalize_with_behavior(h, 2, 8, 1, 10, behavior, now=41)
    assert got == 6


def test_store_scale_event_reuses_outdated_slots_and_needs_behavior():
    h = History()
    alg.store_scale_event(h, None, 1, 5, now=0)
    assert h.scale_up == []
    behavior = {"scaleUp": DEFAULT_UP, "scaleDown": DEFAULT_DOWN}
    alg.store_scale_event(h, behavior, 1, 5, now=0)
    alg.store_scale_event(h, behavior, 5, 7, now=5)
    assert [e.change for e in h.scale_up] == [4, 2]
    alg.store_scale_event(h, behavior, 7, 9, now=100)  # both older than 15 s: one is reused
    assert len(h.scale_up) == 2 and h.scale_up[-1] == ScaleEvent(2, 100)
    alg.store_scale_event(h, behavior, 9, 3, now=101)
    assert h.scale_down == [ScaleEvent(6, 101)]


def test_set_condition_keeps_transition_time_while_status_holds():
    conds = alg.set_condition([], "AbleToScale", "True", "A", "a", "t1")
    conds = alg.set_condition(conds, "AbleToScale", "True", "B", "b", "t2")
    assert conds == [{"type": "AbleToScale", "status": "True", "lastTransitionTime": "t1",
                      "reason": "B", "message": "b"}]
    conds = alg.set_condition(conds, "AbleToScale", "False", "C", "c", "t3")
    assert conds[0]["lastTransitionTime"] == "t3"
    assert [c["type"] for c in alg.set_condition(conds, "ScalingActive", "True", "D", "d",
                                                 "t4")] == ["AbleToScale", "ScalingActive"]
