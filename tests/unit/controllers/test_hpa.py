"""The HPA controller's sync loop against a fake API, under MockClock.

A fake client serves the target's scale subresource, PodMetrics and the
HPA's status; fake informers hold the HPA and the pods.  Time is Trio's
MockClock, so the stabilization windows and rate periods pass in
microseconds of real time.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio
import trio.testing

from fleet.api import patch as patchlib
from fleet.api.kinds.autoscaling import default_hpa
from fleet.client import ApiException
from fleet.client.discovery import APIResource
from fleet.controllers.hpa import HorizontalPodAutoscalerController

NS = "ns"


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def rfc3339(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(seconds: float) -> str:
    return rfc3339(datetime.now(UTC) - timedelta(seconds=seconds))


class FakeInformer:
    def __init__(self) -> None:
        self.cache: dict[str, dict[str, Any]] = {}
        self.synced = trio.Event()
        self.synced.set()

    def get(self, key: str) -> dict[str, Any] | None:
        return self.cache.get(key)

    def list(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [o for o in self.cache.values()
                if namespace is None or o["metadata"].get("namespace") == namespace]

    def put(self, obj: dict[str, Any]) -> None:
        self.cache[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.events]


DEPLOYMENTS = APIResource(name="deployments", singular_name="deployment", namespaced=True,
                          kind="Deployment", group="apps", version="v1",
                          subresources=("scale", "status"))


class FakeClient:
    """Scale subresource, PodMetrics and the HPA's status, in memory."""

    def __init__(self, hpas: FakeInformer) -> None:
        self.hpas = hpas
        self.replicas = 2
        self.selector = "app=web"
        self.usage: dict[str, str] = {}  # pod -> cpu
        self.scale_patches: list[int] = []
        self.fail_scale: ApiException | None = None

    async def resource_for_kind(self, api_version: str, kind: str) -> APIResource:
        if (api_version, kind) != ("apps/v1", "Deployment"):
            raise ApiException({"message": f'no matches for kind "{kind}"', "code": 404}, 404)
        return DEPLOYMENTS

    async def discover(self, *, refresh: bool = False) -> list[APIResource]:
        return [DEPLOYMENTS]

    async def get_object(self, api_version: str, plural: str, name: str,
                         namespace: str | None = None, *, subresource: str | None = None
                         ) -> dict[str, Any]:
        assert (plural, subresource) == ("deployments", "scale")
        if self.fail_scale is not None:
            raise self.fail_scale
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas, "selector": self.selector}}

    async def list(self, api_version: str, plural: str, namespace: str | None = None, *,
                   label_selector: str | None = None, **_: Any) -> dict[str, Any]:
        assert (api_version, plural, label_selector) == ("metrics.k8s.io/v1beta1", "pods",
                                                          self.selector)
        return {"items": [{"metadata": {"name": p, "namespace": NS}, "timestamp": ago(1),
                           "window": "15s", "containers": [{"name": "app",
                                                            "usage": {"cpu": cpu}}]}
                          for p, cpu in self.usage.items()]}

    async def patch(self, api_version: str, plural: str, name: str, body: Any,
                    content_type: str = "", namespace: str | None = None, *,
                    subresource: str | None = None, **_: Any) -> dict[str, Any]:
        if plural == "deployments":
            assert subresource == "scale"
            self.replicas = body["spec"]["replicas"]
            self.scale_patches.append(self.replicas)
            return {}
        assert (plural, subresource) == ("horizontalpodautoscalers", "status")
        key = f"{namespace}/{name}"
        obj = copy.deepcopy(self.hpas.cache[key])
        self.hpas.cache[key] = patchlib.json_merge_patch(obj, body)
        return self.hpas.cache[key]


def pod(name: str, *, ready: bool = True, started_ago: float = 900) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}}}]},
            "status": {"phase": "Running", "startTime": ago(started_ago),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "lastTransitionTime": ago(started_ago - 5)}]}}


def hpa(**spec: Any) -> dict[str, Any]:
    obj = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "web", "namespace": NS, "generation": 1},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": "web"},
                    "minReplicas": 1, "maxReplicas": 10,
                    "metrics": [{"type": "Resource", "resource": {
                        "name": "cpu", "target": {"type": "Utilization",
                                                  "averageUtilization": 50}}}], **spec}}
    default_hpa(obj)
    return obj


class Harness:
    def __init__(self, obj: dict[str, Any], **kw: Any) -> None:
        self.ctl = HorizontalPodAutoscalerController(**kw)
        self.ctl.hpas = FakeInformer()
        self.ctl.pods = FakeInformer()
        self.client = FakeClient(self.ctl.hpas)
        self.events = Recorder()
        self.ctl.ctx = type("Ctx", (), {"client": self.client, "events": self.events})()
        self.ctl.hpas.put(obj)

    def pods(self, usage: dict[str, str]) -> None:
        """The target's pods now are exactly `usage`'s keys, using that much cpu."""
        self.ctl.pods.cache.clear()
        for name in usage:
            self.ctl.pods.put(pod(name))
        self.client.usage = dict(usage)

    async def sync(self) -> dict[str, Any]:
        await self.ctl.reconcile(f"{NS}/web")
        return self.ctl.hpas.cache[f"{NS}/web"]["status"]


def cond(status: dict[str, Any], ctype: str) -> tuple[str, str]:
    c = next(c for c in status["conditions"] if c["type"] == ctype)
    return c["status"], c["reason"]


async def test_scales_up_by_utilization_and_reports_status(autojump_clock) -> None:
    h = Harness(hpa())
    h.pods({"a": "90m", "b": "90m"})  # 90% of the 100m request, target 50%
    status = await h.sync()
    assert h.client.scale_patches == [4]  # ceil(1.8 x 2)
    assert status["currentReplicas"] == 2 and status["desiredReplicas"] == 4
    assert status["currentMetrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "current": {"averageUtilization": 90, "averageValue": "90m"}}}]
    assert "lastScaleTime" in status
    assert cond(status, "AbleToScale") == ("True", "SucceededRescale")
    assert cond(status, "ScalingActive") == ("True", "ValidMetricFound")
    assert cond(status, "ScalingLimited") == ("False", "DesiredWithinRange")
    assert h.events.events == [("Normal", "SuccessfulRescale",
                                "New size: 4; reason: cpu resource utilization (percentage of "
                                "request) above target")]


async def test_legacy_scale_up_limit_holds_the_highest_recommendation(autojump_clock) -> None:
    h = Harness(hpa(), downscale_stabilization=300)
    h.pods({"a": "300m", "b": "300m"})  # 300%: 12 wanted, at most max(2 x 2, 4) at once
    status = await h.sync()
    assert h.client.scale_patches == [4]
    assert cond(status, "ScalingLimited") == ("True", "ScaleUpLimit")
    # Legacy stabilization keeps the highest recommendation of the window (12) while
    # the load lasts: 8 at the next look, then the maximum.
    await trio.sleep(15)
    await h.sync()
    assert h.client.scale_patches == [4, 8]


async def test_legacy_scale_down_window(autojump_clock) -> None:
    h = Harness(hpa(), downscale_stabilization=300)
    h.pods({"a": "100m", "b": "100m"})  # 200% of target: 4
    await h.sync()
    assert h.client.scale_patches == [4]
    h.pods({n: "50m" for n in "abcd"})  # exactly on target
    await trio.sleep(15)
    await h.sync()
    assert h.client.scale_patches == [4]
    h.pods({n: "10m" for n in "abcd"})  # load gone at t=60: 10% -> 1 replica wanted
    await trio.sleep(45)
    status = await h.sync()
    assert cond(status, "AbleToScale") == ("True", "ScaleDownStabilized")
    await trio.sleep(250)  # t=310: the 4 recommended at t=15 is still in the window
    await h.sync()
    assert h.client.scale_patches == [4]
    await trio.sleep(10)  # t=320: it is not
    await h.sync()
    assert h.client.scale_patches == [4, 1]
    assert h.events.reasons() == ["SuccessfulRescale", "SuccessfulRescale"]
    assert "All metrics below target" in h.events.events[1][2]


async def test_behavior_windows_and_rates_under_mock_clock(autojump_clock) -> None:
    behavior = {"scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}]},
                "scaleDown": {"stabilizationWindowSeconds": 20,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 10}]}}
    h = Harness(hpa(behavior=behavior, maxReplicas=8))
    h.pods({"a": "500m", "b": "500m"})
    status = await h.sync()
    assert h.client.scale_patches == [4]  # +2 per 30 s
    assert cond(status, "ScalingLimited") == ("True", "ScaleUpLimit")
    await trio.sleep(15)
    h.pods({n: "500m" for n in "abcd"})
    await h.sync()
    assert h.client.scale_patches == [4]  # the period still holds the +2
    await trio.sleep(16)
    await h.sync()
    assert h.client.scale_patches == [4, 6]
    # Load gone: nothing for the 20 s window, then one pod per 10 s.
    h.pods({n: "1m" for n in "abcdef"})
    await trio.sleep(1)
    await h.sync()
    assert h.client.scale_patches == [4, 6]
    await trio.sleep(20)
    await h.sync()
    assert h.client.scale_patches == [4, 6, 5]
    await trio.sleep(5)
    await h.sync()
    assert h.client.scale_patches == [4, 6, 5]
    await trio.sleep(6)
    await h.sync()
    assert h.client.scale_patches == [4, 6, 5, 4]


async def test_bounds_are_enforced_without_metrics(autojump_clock) -> None:
    h = Harness(hpa(minReplicas=3, maxReplicas=5))
    h.client.replicas = 9
    status = await h.sync()
    assert h.client.scale_patches == [5]
    assert "Current number of replicas above Spec.MaxReplicas" in h.events.events[0][2]
    assert status["desiredReplicas"] == 5
    h.client.replicas = 1
    await h.sync()
    assert h.client.scale_patches == [5, 3]


async def test_zero_replicas_disables_scaling(autojump_clock) -> None:
    h = Harness(hpa())
    h.client.replicas = 0
    status = await h.sync()
    assert h.client.scale_patches == []
    assert cond(status, "ScalingActive") == ("False", "ScalingDisabled")


async def test_missing_metrics_and_unknown_sources_are_reported(autojump_clock) -> None:
    h = Harness(hpa(metrics=[
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 50}}},
        {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                  "target": {"type": "AverageValue", "averageValue": "10"}}}]))
    h.pods({})
    h.ctl.pods.put(pod("a"))
    status = await h.sync()  # no PodMetrics at all
    assert h.client.scale_patches == []
    assert cond(status, "ScalingActive") == ("False", "FailedGetResourceMetric")
    assert "FailedComputeMetricsReplicas" in h.events.reasons()
    assert status["currentMetrics"] == [{"type": ""}, {"type": ""}]
    # With cpu metrics the other (unsupported) source does not block a scale up.
    h.pods({"a": "300m", "b": "300m"})
    status = await h.sync()
    assert h.client.scale_patches == [4]
    assert cond(status, "ScalingActive") == ("True", "ValidMetricFound")
    assert status["currentMetrics"][1] == {"type": ""}


async def test_unreachable_target_and_bad_selector(autojump_clock) -> None:
    h = Harness(hpa())
    h.client.fail_scale = ApiException({"message": 'deployments.apps "web" not found',
                                        "code": 404}, 404)
    status = await h.sync()
    assert cond(status, "AbleToScale") == ("False", "FailedGetScale")
    assert h.events.reasons() == ["FailedGetScale"]
    h.client.fail_scale = None
    h.client.selector = ""
    status = await h.sync()
    assert cond(status, "ScalingActive") == ("False", "InvalidSelector")
    assert "SelectorRequired" in h.events.reasons()


async def test_status_is_written_only_when_it_changes(autojump_clock) -> None:
    h = Harness(hpa())
    h.pods({"a": "50m", "b": "50m"})
    calls = 0
    original = h.client.patch

    async def counting(*args: Any, **kw: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return await original(*args, **kw)

    h.client.patch = counting  # type: ignore[method-assign]
    await h.sync()
    assert calls == 1
    await trio.sleep(15)
    await h.sync()
    assert calls == 1


async def test_resync_and_spec_changes_enqueue(autojump_clock) -> None:
    h = Harness(hpa(), sync_period=15)
    key = f"{NS}/web"
    h.pods({"a": "50m", "b": "50m"})
    async with trio.open_nursery() as n:
        n.start_soon(h.ctl._resync)
        await trio.sleep(0.01)
        assert len(h.ctl.queue) == 1
        assert await h.ctl.queue.get() == key
        h.ctl.queue.done(key)
        old = h.ctl.hpas.cache[key]
        # A status-only update (our own write) is not looked at before the next period...
        h.ctl._on_hpa("MODIFIED", old, {**old, "status": {"currentReplicas": 2}})
        assert len(h.ctl.queue) == 0
        # ... a spec change is.
        changed = copy.deepcopy(old)
        changed["metadata"]["generation"] = 2
        h.ctl._on_hpa("MODIFIED", old, changed)
        assert len(h.ctl.queue) == 1
        n.cancel_scope.cancel()
