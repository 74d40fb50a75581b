"""The disruption controller: PodDisruptionBudget status math (pure, table-driven) and one
sync against fake caches."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fleet.client import ApiException
from fleet.controllers.disruption import (
    DisruptionController,
    Observed,
    conditions_up_to_date,
    count_healthy,
    disrupted_pod_map,
    expected_and_desired,
    fail_safe_status,
    needs_scale,
    next_status,
    rfc3339,
    scaled_value,
    selects,
)

NOW = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
T = rfc3339(NOW)


@pytest.mark.parametrize(("value", "total", "up", "want"), [
    (3, 10, True, 3),
    ("50%", 3, True, 2),    # 1.5 rounds up
    ("50%", 3, False, 1),
    ("34%", 3, True, 2),    # 1.02 rounds up
    ("100%", 7, True, 7),
    ("0%", 7, True, 0),
    ("10%", 0, True, 0),
])
def test_scaled_value(value: int | str, total: int, up: bool, want: int) -> None:
    assert scaled_value(value, total, round_up=up) == want


@pytest.mark.parametrize(("spec", "pods", "scale", "want"), [
    ({"minAvailable": 2}, 3, 10, (3, 2)),          # an integer: the pods present are the base
    ({"minAvailable": "50%"}, 3, 5, (5, 3)),       # a percentage of the controllers' scale, rounded up
    ({"maxUnavailable": 1}, 2, 4, (4, 3)),         # missing pods count as unavailable
    ({"maxUnavailable": "25%"}, 4, 4, (4, 3)),
    ({"maxUnavailable": "30%"}, 3, 3, (3, 2)),     # 0.9 unavailable rounds up to 1
    ({"maxUnavailable": 5}, 3, 3, (3, 0)),         # never below zero
    ({}, 3, 3, (0, 0)),
])
def test_expected_and_desired(spec: dict[str, Any], pods: int, scale: int, want: tuple[int, int]) -> None:
    assert expected_and_desired(spec, pods, scale) == want
    assert needs_scale(spec) is (("maxUnavailable" in spec) or isinstance(spec.get("minAvailable"), str))


def pod(name: str, *, ready: bool = True, deleting: bool = False, labels: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None, ns: str = "ns") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}",
                          "labels": {"app": "web"} if labels is None else labels}
    if deleting:
        md["deletionTimestamp"] = T
    if owner:
        md["ownerReferences"] = [owner]
    return {"metadata": md, "status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def ago(seconds: float) -> str:
    return rfc3339(NOW - dt.timedelta(seconds=seconds))


def test_disrupted_pods_are_forgotten_when_seen_going_or_overdue() -> None:
    recorded = {"going": ago(5), "fresh": ago(30), "overdue": ago(121), "gone": ago(5)}
    pods = [pod("going", deleting=True), pod("fresh"), pod("overdue"), pod("other")]
    got, recheck = disrupted_pod_map(recorded, pods, NOW)
    assert got == {"fresh": ago(30)}
    assert recheck == NOW + dt.timedelta(seconds=90)
    assert disrupted_pod_map(None, pods, NOW) == ({}, None)


def test_healthy_pods_are_ready_not_going_and_not_just_evicted() -> None:
    pods = [pod("a"), pod("b", ready=False), pod("c", deleting=True), pod("d"), pod("e")]
    assert count_healthy(pods, {"d": ago(10), "e": ago(200)}, NOW) == 2  # a, and e (entry expired)


def budget(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
           generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "ns", "generation": generation, "resourceVersion": "10"},
            "spec": spec or {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
            "status": status or {}}


@pytest.mark.parametrize(("seen", "allowed", "cond"), [
    (Observed(3, 2, 3, {}), 1, ("True", "SufficientPods")),
    (Observed(2, 2, 2, {}), 0, ("False", "InsufficientPods")),
    (Observed(1, 2, 2, {}), 0, ("False", "InsufficientPods")),   # never negative
    (Observed(2, 0, 0, {}), 0, ("False", "InsufficientPods")),   # no expected pods: safe
])
def test_next_status(seen: Observed, allowed: int, cond: tuple[str, str]) -> None:
    status = next_status(budget(generation=3), seen, T)
    assert status is not None
    assert status["disruptionsAllowed"] == allowed and status["observedGeneration"] == 3
    [c] = status["conditions"]
    assert (c["type"], c["status"], c["reason"], c["observedGeneration"], c["lastTransitionTime"]) == (
        "DisruptionAllowed", *cond, 3, T)
    assert conditions_up_to_date(status)
    # Nothing changed: nothing to write.
    assert next_status(budget(status=status, generation=3), seen, T) is None


def test_transition_time_moves_only_with_the_status() -> None:
    first = next_status(budget(), Observed(3, 2, 3, {}), "2026-05-01T11:00:00Z")
    assert first is not None
    more = next_status(budget(status=first), Observed(4, 2, 4, {}), T)
    assert more is not None and more["conditions"][0]["lastTransitionTime"] == "2026-05-01T11:00:00Z"
    fewer = next_status(budget(status=more), Observed(2, 2, 4, {}), T)
    assert fewer is not None and fewer["conditions"][0]["lastTransitionTime"] == T


def test_a_spec_change_is_observed_even_when_counts_stay() -> None:
    status = next_status(budget(), Observed(3, 2, 3, {}), T)
    assert status is not None
    again = next_status(budget(status=status, generation=2), Observed(3, 2, 3, {}), T)
    assert again is not None and again["observedGeneration"] == 2


def test_fail_safe_allows_nothing() -> None:
    status = fail_safe_status(budget(status={"disruptionsAllowed": 4, "observedGeneration": 1}), "boom", T)
    assert status["disruptionsAllowed"] == 0
    assert status["conditions"][0]["reason"] == "SyncFailed" and status["conditions"][0]["message"] == "boom"


def test_selects() -> None:
    b = budget()
    assert selects(b, pod("a")) and not selects(b, pod("a", labels={"app": "db"}))
    assert not selects(b, pod("a", ns="other"))
    empty = budget({"selector": {}})
    assert selects(empty, pod("a", labels={}))         # policy/v1: {} selects every pod
    assert not selects(budget({"minAvailable": 1}), pod("a"))  # no selector: none


# -- one sync against fake caches ---------------------------------------------------------


class _Synced:
    def is_set(self) -> bool:
        return True


class FakeInformer:
    synced = _Synced()

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.items = {f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}": o for o in objs}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.items.get(key)

    def list(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [o for o in self.items.values() if namespace is None or o["metadata"].get("namespace") == namespace]


class FakeClient:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []
        self.fail: ApiException | None = None

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, *, subresource: str | None = None) -> dict[str, Any]:
        assert (api_version, plural, subresource) == ("policy/v1", "poddisruptionbudgets", "status")
        if self.fail is not None:
            raise self.fail
        self.writes.append(body)
        return body

    async def resource_for_kind(self, api_version: str, kind: str) -> Any:
        raise ApiException({"message": "no such kind", "code": 404}, 404)


class FakeEvents:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorded.append((type_, reason))


def controller(pdb: dict[str, Any], pods: list[dict[str, Any]], *, rs: list[dict[str, Any]] = (),
               deployments: list[dict[str, Any]] = ()) -> tuple[DisruptionController, FakeClient, FakeEvents]:
    c = DisruptionController(now=lambda: NOW)
    client, events = FakeClient(), FakeEvents()
    c.ctx = type("Ctx", (), {"client": client, "events": events})()  # type: ignore[assignment]
    c.pdbs, c.pods = FakeInformer(pdb), FakeInformer(*pods)  # type: ignore[assignment]
    c.replicasets, c.deployments = FakeInformer(*rs), FakeInformer(*deployments)  # type: ignore[assignment]
    c.statefulsets = FakeInformer()  # type: ignore[assignment]
    return c, client, events


RS_REF = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-uid", "controller": True}
DEP_REF = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "dep-uid", "controller": True}


def workload(replicas: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rs = {"metadata": {"name": "web-1", "namespace": "ns", "uid": "rs-uid", "ownerReferences": [DEP_REF]},
          "spec": {"replicas": replicas}}
    dep = {"metadata": {"name": "web", "namespace": "ns", "uid": "dep-uid"}, "spec": {"replicas": replicas}}
    return [rs], [dep]


async def test_sync_writes_the_status_with_the_read_revision() -> None:
    c, client, _ = controller(budget(), [pod("a"), pod("b"), pod("c", ready=False), pod("x", labels={})])
    assert await c.reconcile("ns/web") is None
    [written] = client.writes
    assert written["metadata"]["resourceVersion"] == "10"
    s = written["status"]
    assert (s["currentHealthy"], s["desiredHealthy"], s["expectedPods"], s["disruptionsAllowed"]) == (2, 2, 3, 0)


async def test_percentages_use_the_deployment_scale() -> None:
    rs, deps = workload(replicas=4)
    pods = [pod(n, owner=RS_REF) for n in ("a", "b", "c")]  # one of four is missing
    c, client, _ = controller(budget({"maxUnavailable": "25%", "selector": {"matchLabels": {"app": "web"}}}),
                              pods, rs=rs, deployments=deps)
    await c.reconcile("ns/web")
    s = client.writes[0]["status"]
    assert (s["expectedPods"], s["desiredHealthy"], s["currentHealthy"], s["disruptionsAllowed"]) == (4, 3, 3, 0)


async def test_unmanaged_pods_are_reported_and_a_missing_controller_fails_safe() -> None:
    rs, deps = workload(replicas=2)
    spec = {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}}
    c, client, events = controller(budget(spec), [pod("a", owner=RS_REF), pod("bare")], rs=rs, deployments=deps)
    await c.reconcile("ns/web")
    assert ("Warning", "UnmanagedPods") in events.recorded
    assert client.writes[0]["status"]["expectedPods"] == 2
    lost = {**RS_REF, "uid": "gone"}
    c, client, events = controller(budget(spec, {"disruptionsAllowed": 1, "observedGeneration": 1}),
                                   [pod("a", owner=lost)], rs=rs, deployments=deps)
    await c.reconcile("ns/web")
    assert ("Warning", "CalculateExpectedPodCountFailed") in events.recorded
    s = client.writes[0]["status"]
    assert s["disruptionsAllowed"] == 0 and s["conditions"][0]["reason"] == "SyncFailed"
    assert s["conditions"][0]["message"] == 'found no controllers for pod "a"'


async def test_pending_evictions_are_kept_and_rechecked_when_they_expire() -> None:
    status = {"disruptedPods": {"a": ago(30), "gone": ago(10)}, "observedGeneration": 1}
    c, client, _ = controller(budget(status=status), [pod("a"), pod("b"), pod("c")])
    again = await c.reconcile("ns/web")
    s = client.writes[0]["status"]
    assert s["disruptedPods"] == {"a": ago(30)} and s["currentHealthy"] == 2
    assert again == pytest.approx(90.5)


async def test_a_conflict_is_retried() -> None:
    c, client, _ = controller(budget(), [pod("a")])
    client.fail = ApiException({"message": "conflict", "code": 409}, 409)
    assert await c.reconcile("ns/web") == pytest.approx(0.05)  # quietly, soon
    client.fail = ApiException({"message": "boom", "code": 500}, 500)
    with pytest.raises(ApiException):
        await c.reconcile("ns/web")  # anything else backs off


async def test_no_pods_is_an_event() -> None:
    c, client, events = controller(budget(), [])
    await c.reconcile("ns/web")
    assert ("Normal", "NoPods") in events.recorded
    assert client.writes[0]["status"]["disruptionsAllowed"] == 0


def marked(since: float, **kw: Any) -> dict[str, Any]:
    p = pod("a", **kw)
    p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                      "reason": "EvictionByEvictionAPI", "lastTransitionTime": ago(since)})
    return p


@pytest.mark.parametrize(("obj", "want"), [
    (pod("a"), None),
    (marked(30), 90.0),
    (marked(300), 0.0),
    (marked(300, deleting=True), None),  # its deletion is under way: not stale
])
def test_stale_disruption_wait(obj: dict[str, Any], want: float | None) -> None:
    from fleet.controllers.disruption import stale_disruption_wait

    assert stale_disruption_wait(obj, NOW) == want


async def test_a_stale_disruption_target_is_reset() -> None:
    c, client, _ = controller(budget(), [marked(300)])
    patches: list[tuple[str, Any]] = []

    async def patch(api_version: str, plural: str, name: str, body: Any, content_type: str,
                    namespace: str | None = None, *, subresource: str | None = None) -> dict[str, Any]:
        patches.append((f"{plural}/{name}/{subresource}", body))
        return {}

    client.patch = patch  # type: ignore[attr-defined]
    assert await c.reset_stale_condition("ns/a") is None
    [(path, body)] = patches
    assert path == "pods/a/status"
    assert body["status"]["conditions"][0] == {"type": "DisruptionTarget", "status": "False",
                                               "lastTransitionTime": T}
    c.pods = FakeInformer(marked(30))  # type: ignore[assignment]
    assert await c.reset_stale_condition("ns/a") == 90.0
