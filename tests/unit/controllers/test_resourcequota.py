"""The ResourceQuota controller: its decisions (pure) and one recount against fake caches."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api import quota as q
from fleet.client import ApiException
from fleet.controllers.resourcequota import (
    ResourceQuotaController,
    needs_sync,
    next_status,
    pod_charge_changed,
)

NOW = 1_800_000_000.0


def quota(hard: dict[str, str], status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ResourceQuota",
                           "metadata": {"name": "q", "namespace": "ns", "resourceVersion": "7"},
                           "spec": {"hard": hard, **spec}}
    if status is not None:
        obj["status"] = status
    return obj


def test_needs_sync() -> None:
    assert needs_sync(quota({"pods": "1"}))
    assert needs_sync(quota({"pods": "2"}, {"hard": {"pods": "1"}, "used": {"pods": "0"}}))
    assert not needs_sync(quota({"cpu": "1"}, {"hard": {"cpu": "1000m"}, "used": {"cpu": "0"}}))


def test_next_status_mirrors_hard_and_masks_used() -> None:
    usage = {"pods": q.Quantity.of(2), "requests.cpu": q.Quantity.parse("1500m")}
    old = {"hard": {"pods": "5", "secrets": "3"}, "used": {"pods": "4", "secrets": "1", "services": "9"}}
    got = next_status(quota({"pods": "5", "requests.cpu": "2", "secrets": "3"}, old), usage)
    # recounted where counted, kept where not, dropped when no longer limited
    assert got == {"hard": {"pods": "5", "requests.cpu": "2", "secrets": "3"},
                   "used": {"pods": "2", "requests.cpu": "1500m", "secrets": "1"}}
    current = quota({"pods": "5"}, {"hard": {"pods": "5"}, "used": {"pods": "2"}})
    assert next_status(current, {"pods": q.Quantity.of(2)}) is None


def pod(name: str, cpu: str = "100m", phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns"}
    if deleting:
        md.update(deletionTimestamp="2026-01-01T00:00:00Z", deletionGracePeriodSeconds=30)
    return {"metadata": md, "status": {"phase": phase},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}


@pytest.mark.parametrize(("old", "new", "changed"), [
    (pod("a"), pod("a", cpu="100m"), False),
    (pod("a"), pod("a", phase="Succeeded"), True),
    (pod("a"), pod("a", deleting=True), True),
    (pod("a", phase="Pending"), pod("a"), False),
    (None, pod("a"), True),
])
def test_pod_charge_changed(old: dict[str, Any] | None, new: dict[str, Any], changed: bool) -> None:
    assert pod_charge_changed(old, new, NOW) is changed


class _Synced:
    def is_set(self) -> bool:
        return True


class FakeInformer:
    synced = _Synced()

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.items = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objs}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.items.get(key)

    def list(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [o for o in self.items.values() if namespace is None or o["metadata"]["namespace"] == namespace]


class FakeClient:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, *, subresource: str | None = None) -> dict[str, Any]:
        assert (api_version, plural, subresource) == ("v1", "resourcequotas", "status")
        self.writes.append(body)
        return body


def controller(quotas: list[dict[str, Any]], pods: list[dict[str, Any]]) -> tuple[ResourceQuotaController,
                                                                               FakeClient]:
    c = ResourceQuotaController(clock=lambda: NOW)
    client = FakeClient()
    c.ctx = type("Ctx", (), {"client": client})()  # type: ignore[assignment]
    c.quotas, c.pods = FakeInformer(*quotas), FakeInformer(*pods)  # type: ignore[assignment]
    return c, client


async def test_recount_from_the_pods() -> None:
    qt = quota({"pods": "10", "requests.cpu": "4", "count/pods": "20", "resourcequotas": "2"})
    c, client = controller([qt], [pod("a", "250m"), pod("b", "1"), pod("done", "2", phase="Failed")])
    await c.reconcile("ns/q")
    [written] = client.writes
    assert written["metadata"]["resourceVersion"] == "7"
    assert written["status"] == {
        "hard": {"count/pods": "20", "pods": "10", "requests.cpu": "4", "resourcequotas": "2"},
        "used": {"count/pods": "3", "pods": "2", "requests.cpu": "1250m", "resourcequotas": "1"}}


async def test_replenish_enqueues_quotas_counting_the_resource() -> None:
    pods_quota = quota({"pods": "1"})
    cm_quota = {**quota({"configmaps": "1"}), "metadata": {"name": "cm", "namespace": "ns"}}
    c, _ = controller([pods_quota, cm_quota], [])
    c.replenish("ns", "", "pods")
    assert await c.queue.get() == "ns/q" and len(c.queue) == 0
    c._on_pod("DELETED", pod("a"), None)
    c._on_pod("ADDED", None, pod("b"))  # creates were charged by admission: no recount
    assert len(c.queue) == 1  # "ns/q" is being processed; queued again when done
    c.queue.done("ns/q")
    assert await c.queue.get() == "ns/q" and len(c.queue) == 0


async def test_a_quota_charge_by_admission_does_not_trigger_a_recount() -> None:
    synced = quota({"pods": "5"}, {"hard": {"pods": "5"}, "used": {"pods": "1"}})
    charged = quota({"pods": "5"}, {"hard": {"pods": "5"}, "used": {"pods": "2"}})
    c, _ = controller([synced], [])
    c._on_quota("MODIFIED", synced, charged)
    assert len(c.queue) == 0
    raised = quota({"pods": "6"}, {"hard": {"pods": "5"}, "used": {"pods": "2"}})
    c._on_quota("MODIFIED", charged, raised)
    assert len(c.queue) == 1


async def test_a_lost_write_is_retried() -> None:
    c, client = controller([quota({"pods": "1"})], [])

    async def conflict(*a: Any, **kw: Any) -> dict[str, Any]:
        raise ApiException({"message": "conflict", "code": 409}, 409)

    client.replace = conflict  # type: ignore[method-assign]
    assert await c.reconcile("ns/q") == pytest.approx(0.05)
