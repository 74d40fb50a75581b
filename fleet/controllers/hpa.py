"""HorizontalPodAutoscaler controller: scale a target by its pods' resource usage.

kube-controller-manager's horizontal-pod-autoscaler, one sync per HPA every
`sync_period` (15 s; `fleet server --hpa-sync-period`), plus one at once when
an HPA appears or its spec changes:

    scaleTargetRef ──discovery──▶ the target's scale subresource (GET)
        │  currentReplicas = scale.spec.replicas, selector = scale.status.selector
        ▼
    replicas == 0 (and minReplicas > 0)?  ── scaling disabled, nothing to do
    outside [minReplicas, maxReplicas]?   ── move to the nearest bound
    otherwise, per metric: pods (pod informer, selector) + PodMetrics
        (GET metrics.k8s.io/v1beta1 .../pods?labelSelector=) → a proposal
        (fleet/controllers/hpa_algorithm.py); the largest wins,
        then stabilization and rate limits (legacy rules, or spec.behavior)
        ▼
    changed? PATCH the scale subresource, event SuccessfulRescale
    status: currentReplicas, desiredReplicas, currentMetrics, lastScaleTime,
        conditions AbleToScale / ScalingActive / ScalingLimited — written only
        when it changed

Scaling goes through the scale subresource only, so any kind that has one
(Deployment, ReplicaSet, StatefulSet, custom resources) can be a target,
and the HPA never needs to know how that kind makes pods.

Supported metric sources: `Resource` and `ContainerResource` (cpu, memory;
Utilization and AverageValue targets), read from the resource metrics API
the API server serves.  `Pods`, `Object` and `External` need custom or
external metrics APIs that Fleet does not serve: such a metric is reported
invalid (ScalingActive False) exactly like an unavailable metric in
Kubernetes, and the other metrics still scale.

The recommendation history (stabilization windows, rate-policy events) lives
in memory, as in Kubernetes: after a restart the windows start afresh.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import meta, selectors
from fleet.api.errors import APIError
from fleet.api.kinds.metrics import API_VERSION as METRICS_API_VERSION
from fleet.api.kinds.metrics import format_milli
from fleet.client import MERGE_PATCH, ApiException
from fleet.controllers import hpa_algorithm as alg
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer

log = logging.getLogger(__name__)

HPA_API_VERSION = "autoscaling/v2"
HPA_PLURAL = "horizontalpodautoscalers"
DEFAULT_SYNC_PERIOD = 15.0


@dataclass
class _Sync:
    """One reconcile's working state: the status being built and what to emit."""

    hpa: dict[str, Any]
    conditions: list[dict[str, Any]]
    now: str = field(default_factory=meta.now_rfc3339)

    def condition(self, ctype: str, status: str, reason: str, message: str) -> None:
        self.conditions = alg.set_condition(self.conditions, ctype, status, reason, message,
                                            self.now)


class MetricFailure(Exception):
    """A metric gave no proposal; carries the ScalingActive condition it implies."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class HorizontalPodAutoscalerController(QueueWorker):
    name = "horizontalpodautoscaler"
    workers = 2

    def __init__(self, *, sync_period: float = DEFAULT_SYNC_PERIOD,
                 downscale_stabilization: float = alg.DOWNSCALE_STABILIZATION,
                 tolerance: float = alg.TOLERANCE,
                 cpu_initialization_period: float = alg.CPU_INITIALIZATION_PERIOD,
                 initial_readiness_delay: float = alg.INITIAL_READINESS_DELAY) -> None:
        super().__init__()
        self.sync_period = sync_period
        self.downscale_stabilization = downscale_stabilization
        self.tolerance = tolerance
        self.timing = {"cpu_initialization_period": cpu_initialization_period,
                       "initial_readiness_delay": initial_readiness_delay}
        self.history: dict[str, alg.History] = {}
        # The selector each HPA used last, to refuse pods that two HPAs would fight over.
        self.selectors: dict[str, selectors.LabelSelector] = {}

    # -- wiring ------------------------------------------------------------------------------

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.hpas: SharedInformer = ctx.informers.informer(HPA_API_VERSION, HPA_PLURAL)
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.hpas.add_handler(self._on_hpa)

    def _on_hpa(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED" and old is not None:
            key = f"{old['metadata'].get('namespace', '')}/{old['metadata']['name']}"
            self.history.pop(key, None)
            self.selectors.pop(key, None)
            return
        if new is None:
            return
        # Our own status writes come back as updates: only a new HPA or a changed spec
        # is looked at before the next period.
        if old is None or (old.get("metadata") or {}).get("generation") != \
                (new.get("metadata") or {}).get("generation"):
            self.enqueue(new)

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(self._resync)
            n.start_soon(super().run, ctx)

    async def _resync(self) -> None:
        """Every HPA once per sync period (the queue drops keys already waiting)."""
        await self.hpas.synced.wait()
        while True:
            for key in list(self.hpas.cache):
                self.queue.add(key)
            await trio.sleep(max(0.1, self.sync_period))

    # -- one HPA -----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> float | None:
        hpa = self.hpas.get(key)
        if hpa is None:
            self.history.pop(key, None)
            self.selectors.pop(key, None)
            return None
        status = hpa.get("status") or {}
        sync = _Sync(hpa, [dict(c) for c in status.get("conditions") or [] if isinstance(c, dict)])
        await self._reconcile(key, hpa, sync)
        return None

    async def _reconcile(self, key: str, hpa: dict[str, Any], sync: _Sync) -> None:
        spec = hpa.get("spec") or {}
        ns = hpa["metadata"].get("namespace", "")
        ref = spec.get("scaleTargetRef") or {}
        reference = f"{ref.get('kind')}/{ns}/{ref.get('name')}"
        old_status = hpa.get("status") or {}
        try:
            resource = await self._resource_for(ref)
            scale = await self.ctx.client.get_object(resource.api_version, resource.name,
                                                     str(ref.get("name", "")), ns,
                                                     subresource="scale")
        except (ApiException, ValueError) as e:
            message = _message(e)
            self._event(hpa, "Warning", "FailedGetScale", message)
            sync.condition("AbleToScale", "False", "FailedGetScale",
                           f"the HPA controller was unable to get the target's current scale: "
                           f"{message}")
            await self._write_status(hpa, old_status, self._status(
                hpa, sync, int(old_status.get("currentReplicas") or 0),
                int(old_status.get("desiredReplicas") or 0), old_status.get("currentMetrics"),
                rescaled=False))
            return
        sync.condition("AbleToScale", "True", "SucceededGetScale",
                       "the HPA controller was able to get the target's current scale")
        current = int((scale.get("spec") or {}).get("replicas") or 0)
        history = self.history.setdefault(key, alg.History())
        now = trio.current_time()
        alg.record_initial_recommendation(history, current, now)

        min_replicas = int(spec.get("minReplicas") or 1)
        max_replicas = int(spec.get("maxReplicas") or 0)
        statuses: list[dict[str, Any]] | None = None
        reason = ""
        desired = 0
        rescale = True
        if current == 0 and min_replicas != 0:
            rescale = False
            sync.condition("ScalingActive", "False", "ScalingDisabled",
                           "scaling is disabled since the replica count of the target is zero")
        elif current > max_replicas:
            reason, desired = "Current number of replicas above Spec.MaxReplicas", max_replicas
        elif current < min_replicas:
            reason, desired = "Current number of replicas below Spec.MinReplicas", min_replicas
        else:
            proposal, metric_name, statuses, error = await self._compute(key, hpa, scale, current,
                                                                         sync)
            if proposal < 0:
                self._event(hpa, "Warning", "FailedComputeMetricsReplicas", error)
                await self._write_status(hpa, old_status, self._status(
                    hpa, sync, current, int(old_status.get("desiredReplicas") or 0),
                    statuses if statuses is not None else old_status.get("currentMetrics"),
                    rescaled=False))
                return
            desired = proposal
            if desired > current:
                reason = f"{metric_name} above target"
            elif desired < current:
                reason = "All metrics below target"
            behavior = spec.get("behavior")
            if isinstance(behavior, dict):
                desired, conds = alg.normalize_with_behavior(
                    history, current, desired, min_replicas, max_replicas, behavior, now,
                    self.downscale_stabilization)
            else:
                desired, conds = alg.normalize_legacy(history, current, desired, min_replicas,
                                                      max_replicas, now,
                                                      self.downscale_stabilization)
            for c in conds:
                sync.condition(*c)
            rescale = desired != current

        if rescale:
            try:
                await self.ctx.client.patch(resource.api_version, resource.name,
                                            str(ref.get("name", "")),
                                            {"spec": {"replicas": desired}}, MERGE_PATCH, ns,
                                            subresource="scale")
            except ApiException as e:
                message = _message(e)
                self._event(hpa, "Warning", "FailedRescale",
                            f"New size: {desired}; reason: {reason}; error: {message}")
                sync.condition("AbleToScale", "False", "FailedUpdateScale",
                               f"the HPA controller was unable to update the target scale: "
                               f"{message}")
                await self._write_status(hpa, old_status, self._status(
                    hpa, sync, current, int(old_status.get("desiredReplicas") or 0),
                    old_status.get("currentMetrics"), rescaled=False))
                log.info("hpa %s: rescaling %s failed: %s", key, reference, message)
                return
            sync.condition("AbleToScale", "True", "SucceededRescale",
                           f"the HPA controller was able to update the target scale to {desired}")
            self._event(hpa, "Normal", "SuccessfulRescale",
                        f"New size: {desired}; reason: {reason}")
            alg.store_scale_event(history, spec.get("behavior") if isinstance(
                spec.get("behavior"), dict) else None, current, desired, trio.current_time())
            log.info("hpa %s: rescaled %s from %d to %d (%s)", key, reference, current, desired,
                     reason)
        else:
            desired = current
        await self._write_status(hpa, old_status, self._status(hpa, sync, current, desired,
                                                               statuses, rescaled=rescale))

    async def _resource_for(self, ref: dict[str, Any]) -> Any:
        api_version, kind = str(ref.get("apiVersion") or ""), str(ref.get("kind") or "")
        if "/" not in api_version and api_version != "v1":
            raise ValueError(f"invalid API version in scale target reference: {api_version!r}")
        try:
            res = await self.ctx.client.resource_for_kind(api_version, kind)
        except ApiException:
            # A kind served since we last looked (a new CRD): ask discovery again once.
            await self.ctx.client.discover(refresh=True)
            res = await self.ctx.client.resource_for_kind(api_version, kind)
        if "scale" not in res.subresources:
            raise ValueError(f"{res.group_resource} has no scale subresource")
        return res

    # -- metrics -----------------------------------------------------------------------------

    async def _compute(self, key: str, hpa: dict[str, Any], scale: dict[str, Any], current: int,
                       sync: _Sync) -> tuple[int, str, list[dict[str, Any]] | None, str]:
        """(largest proposal or -1, its metric's name, metric statuses, error message)."""
        ns = hpa["metadata"].get("namespace", "")
        raw_selector = (scale.get("status") or {}).get("selector") or ""
        if not raw_selector:
            message = "selector is required"
            self._event(hpa, "Warning", "SelectorRequired", message)
            sync.condition("ScalingActive", "False", "InvalidSelector",
                           "the HPA target's scale is missing a selector")
            return -1, "", None, message
        try:
            selector = selectors.parse_label_selector(raw_selector)
        except APIError as e:
            message = f"couldn't convert selector into a corresponding internal selector " \
                      f"object: {e.message}"
            self._event(hpa, "Warning", "InvalidSelector", message)
            sync.condition("ScalingActive", "False", "InvalidSelector", message)
            return -1, "", None, message
        pods = [p for p in self.pods.list(ns) if selector.matches(
            (p.get("metadata") or {}).get("labels"))]
        self.selectors[key] = selector
        others = sorted(k for k, sel in self.selectors.items()
                        if k != key and k.startswith(f"{ns}/") and any(
                            sel.matches((p.get("metadata") or {}).get("labels")) for p in pods))
        if others:
            message = f"pods by selector {raw_selector} are controlled by multiple HPAs: " \
                      f"{[key, *others]}"
            self._event(hpa, "Warning", "AmbiguousSelector", message)
            sync.condition("ScalingActive", "False", "AmbiguousSelector", message)
            return -1, "", None, message

        specs = [m for m in (hpa.get("spec") or {}).get("metrics") or [] if isinstance(m, dict)]
        statuses: list[dict[str, Any]] = [{"type": ""} for _ in specs]
        best, best_name = 0, ""
        invalid: list[MetricFailure] = []
        cached: dict[str, Any] = {}
        for i, m in enumerate(specs):
            try:
                proposal, name, statuses[i] = await self._metric(m, ns, raw_selector, pods,
                                                                 current, cached)
            except MetricFailure as e:
                self._event(hpa, "Warning", e.reason, str(e))
                invalid.append(e)
                continue
            if best == 0 or proposal > best:
                best, best_name = proposal, name
        if invalid and (len(invalid) >= len(specs) or best < current):
            first = invalid[0]
            sync.condition("ScalingActive", "False", first.reason,
                           f"the HPA was unable to compute the replica count: {first}")
            return -1, "", statuses, (f"invalid metrics ({len(invalid)} invalid out of "
                                      f"{len(specs)}), first error is: {first}")
        sync.condition("ScalingActive", "True", "ValidMetricFound",
                       f"the HPA was able to successfully calculate a replica count from "
                       f"{best_name}")
        return best, best_name, statuses, ""

    async def _metric(self, m: dict[str, Any], ns: str, raw_selector: str,
                      pods: list[dict[str, Any]], current: int,
                      cached: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
        mtype = m.get("type")
        if mtype not in ("Resource", "ContainerResource"):
            reason = {"Pods": "FailedGetPodsMetric", "Object": "FailedGetObjectMetric",
                      "External": "FailedGetExternalMetric"}.get(str(mtype),
                                                                 "InvalidMetricSourceType")
            raise MetricFailure(reason, f"{mtype} metrics need a custom or external metrics API, "
                                        "which Fleet does not serve")
        field_name = "resource" if mtype == "Resource" else "containerResource"
        src = m.get(field_name) or {}
        resource = str(src.get("name", ""))
        container = str(src.get("container", "")) if mtype == "ContainerResource" else ""
        target = src.get("target") or {}
        fail_reason = "FailedGetResourceMetric" if mtype == "Resource" else \
            "FailedGetContainerResourceMetric"
        what = f"{resource} resource metric value" if mtype == "Resource" else \
            f"{container} container metric value"
        try:
            if "items" not in cached:
                try:
                    cached["items"] = (await self.ctx.client.list(
                        METRICS_API_VERSION, "pods", ns, label_selector=raw_selector)).get(
                        "items") or []
                except ApiException as e:
                    raise alg.MetricError("unable to fetch metrics from resource metrics API: "
                                          f"{_message(e)}") from None
            metrics = alg.pod_metrics_from_api(cached["items"], resource, container)
            wall = time.time()
            if target.get("averageValue") is not None:
                value = alg.milli(target["averageValue"])
                if not value:
                    raise alg.MetricError("invalid average value target")
                proposal, usage = alg.raw_resource_replicas(
                    current, value, resource, pods, metrics, wall, tolerance=self.tolerance,
                    **self.timing)
                current_status: dict[str, Any] = {"averageValue": format_milli(usage)}
                name = f"{resource} resource"
            elif target.get("averageUtilization") is not None:
                proposal, utilization, raw = alg.resource_replicas(
                    current, int(target["averageUtilization"]), resource, pods, metrics, wall,
                    container=container, tolerance=self.tolerance, **self.timing)
                current_status = {"averageUtilization": utilization,
                                  "averageValue": format_milli(raw)}
                name = f"{resource} resource utilization (percentage of request)" \
                    if mtype == "Resource" else \
                    f"{resource} container resource utilization (percentage of request)"
            else:
                raise alg.MetricError("invalid resource metric source: neither an average "
                                      "utilization target nor an average value target was set")
        except alg.MetricError as e:
            raise MetricFailure(fail_reason, f"failed to get {what}: failed to get {resource} "
                                             f"utilization: {e}") from None
        status_src: dict[str, Any] = {"name": resource, "current": current_status}
        if container:
            status_src["container"] = container
        return proposal, name, {"type": mtype, field_name: status_src}

    # -- output ------------------------------------------------------------------------------

    def _status(self, hpa: dict[str, Any], sync: _Sync, current: int, desired: int,
                metrics: list[dict[str, Any]] | None, *, rescaled: bool) -> dict[str, Any]:
        old = hpa.get("status") or {}
        status: dict[str, Any] = {"currentReplicas": current, "desiredReplicas": desired}
        last = sync.now if rescaled else old.get("lastScaleTime")
        if last:
            status["lastScaleTime"] = last
        if metrics:
            status["currentMetrics"] = metrics
        if sync.conditions:
            status["conditions"] = sync.conditions
        return status

    async def _write_status(self, hpa: dict[str, Any], old: dict[str, Any],
                            new: dict[str, Any]) -> None:
        if old == new:
            return
        # A merge patch of the whole status: keys gone from it are sent as null.
        patch = {**{k: None for k in old if k not in new}, **new}
        md = hpa["metadata"]
        try:
            await self.ctx.client.patch(HPA_API_VERSION, HPA_PLURAL, md["name"], {"status": patch},
                                        MERGE_PATCH, md.get("namespace"), subresource="status")
        except ApiException as e:
            if e.code == 404:
                return  # deleted meanwhile
            self._event(hpa, "Warning", "FailedUpdateStatus", _message(e))
            raise

    def _event(self, hpa: dict[str, Any], type_: str, reason: str, message: str) -> None:
        if self.ctx.events is not None:
            self.ctx.events.record(hpa, type_, reason, message)


def _message(e: Exception) -> str:
    msg = getattr(e, "message", None)
    return str(msg) if msg else str(e)


__all__ = ["DEFAULT_SYNC_PERIOD", "HorizontalPodAutoscalerController"]
