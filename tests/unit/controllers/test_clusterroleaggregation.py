"""ClusterRole aggregation (fleet/controllers/clusterroleaggregation.py): the pure
`aggregate_rules` and the controller's writes over a fake client/informer."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.client import ApiException
from fleet.controllers.clusterroleaggregation import (
    ClusterRoleAggregationController,
    aggregate_rules,
)

VIEW_LABEL = "rbac.authorization.k8s.io/aggregate-to-view"


def cr(name: str, rules: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None,
       selectors: list[dict[str, Any]] | None = None, rv: str = "1") -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "ClusterRole", "metadata": {"name": name, "labels": labels or {},
                                                               "resourceVersion": rv}}
    if rules is not None:
        obj["rules"] = rules
    if selectors is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": selectors}
    return obj


R1 = {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}
R2 = {"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}
R3 = {"verbs": ["get"], "apiGroups": ["apps"], "resources": ["deployments"]}
VIEW = cr("view", selectors=[{"matchLabels": {VIEW_LABEL: "true"}}])


def test_not_aggregated() -> None:
    assert aggregate_rules(cr("plain", [R1]), []) is None


def test_union_in_name_order_without_duplicates() -> None:
    roles = [VIEW, cr("b", [R2, R1], {VIEW_LABEL: "true"}), cr("a", [R1], {VIEW_LABEL: "true"}),
             cr("c", [R3], {"other": "x"})]
    assert aggregate_rules(VIEW, roles) == [R1, R2]


def test_several_selectors_and_expressions() -> None:
    role = cr("agg", selectors=[{"matchLabels": {"x": "1"}},
                                {"matchExpressions": [{"key": "y", "operator": "Exists"}]}])
    roles = [role, cr("a", [R1], {"x": "1"}), cr("b", [R3], {"y": "anything"}), cr("c", [R2], {"x": "2"})]
    assert aggregate_rules(role, roles) == [R1, R3]


def test_itself_is_skipped_and_empty_is_empty() -> None:
    role = cr("self", [R1], {"x": "1"}, selectors=[{"matchLabels": {"x": "1"}}])
    assert aggregate_rules(role, [role]) == []


class FakeRoles:
    def __init__(self, roles: list[dict[str, Any]]) -> None:
        self.roles = {r["metadata"]["name"]: r for r in roles}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.roles.get(key.lstrip("/"))

    def list(self) -> list[dict[str, Any]]:
        return list(self.roles.values())


class FakeClient:
    def __init__(self, fail: int | None = None) -> None:
        self.patches: list[tuple[str, Any]] = []
        self.fail = fail

    async def patch(self, api_version: str, plural: str, name: str, patch: Any, content_type: str) -> Any:
        if self.fail:
            raise ApiException({"message": "boom"}, self.fail)
        self.patches.append((name, patch))
        return {}


def controller(roles: list[dict[str, Any]], client: FakeClient) -> ClusterRoleAggregationController:
    c = ClusterRoleAggregationController()
    c.roles = FakeRoles(roles)  # type: ignore[assignment]
    c.ctx = type("Ctx", (), {"client": client})()  # type: ignore[assignment]
    return c


async def test_controller_writes_only_changes() -> None:
    client = FakeClient()
    c = controller([cr("view", selectors=[{"matchLabels": {VIEW_LABEL: "true"}}], rv="7"),
                    cr("a", [R1], {VIEW_LABEL: "true"})], client)
    assert await c.reconcile("/view") is None
    assert client.patches == [("view", {"metadata": {"resourceVersion": "7"}, "rules": [R1]})]
    # Already aggregated: no write.
    client.patches.clear()
    c.roles.roles["view"]["rules"] = [R1]  # type: ignore[attr-defined]
    assert await c.reconcile("/view") is None
    assert client.patches == []
    # Gone, or not aggregated: nothing.
    assert await c.reconcile("/missing") is None
    assert await c.reconcile("/a") is None
    assert client.patches == []


@pytest.mark.parametrize(("code", "want"), [(409, 0.1), (404, None)])
async def test_controller_conflicts(code: int, want: float | None) -> None:
    c = controller([VIEW, cr("a", [R1], {VIEW_LABEL: "true"})], FakeClient(fail=code))
    assert await c.reconcile("/view") == want


async def test_every_change_requeues_the_aggregated_roles() -> None:
    c = controller([VIEW, cr("a", [R1], {VIEW_LABEL: "true"}), cr("edit", selectors=[{"matchLabels": {"e": "1"}}])],
                   FakeClient())
    c.enqueue_aggregated()
    assert len(c.queue) == 2
    assert {await c.queue.get(), await c.queue.get()} == {"/edit", "/view"}
