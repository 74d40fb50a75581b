"""`fleet secrets rotate`'s loop against a fake client: every object of every
matching served resource is PUT back; a conflict re-reads and retries; an object
deleted meanwhile is skipped; wildcards expand through discovery."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.cli.secrets import rotate_all
from fleet.client import ApiException
from fleet.client.discovery import APIResource

SECRETS = APIResource("secrets", "secret", True, "Secret", "", "v1", ("list", "update"))
CMS = APIResource("configmaps", "configmap", True, "ConfigMap", "", "v1", ("list", "update"))
DEPLOYS = APIResource("deployments", "deployment", True, "Deployment", "apps", "v1", ("list", "update"))


class FakeClient:
    def __init__(self, objects: dict[str, list[dict[str, Any]]], conflicts: set[str],
                 gone: set[str]) -> None:
        self.objects, self.conflicts, self.gone = objects, conflicts, gone
        self.puts: list[tuple[str, str, str]] = []
        self.gets: list[str] = []

    async def discover(self) -> list[APIResource]:
        return [SECRETS, CMS, DEPLOYS]

    async def list_all(self, api_version: str, plural: str) -> dict[str, Any]:
        return {"items": [dict(o) for o in self.objects.get(plural, [])]}

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None) -> dict[str, Any]:
        if name in self.gone:
            raise ApiException({"code": 404, "reason": "NotFound"}, 404)
        if name in self.conflicts:
            self.conflicts.discard(name)
            raise ApiException({"code": 409, "reason": "Conflict"}, 409)
        self.puts.append((plural, namespace or "", name))
        assert body["kind"] and body["apiVersion"]
        return body

    async def get_object(self, api_version: str, plural: str, name: str,
                         namespace: str | None) -> dict[str, Any]:
        self.gets.append(name)
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "9"}}


def _obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}}


async def test_rewrites_every_object_retrying_conflicts_and_skipping_deleted() -> None:
    c = FakeClient({"secrets": [_obj("a"), _obj("b"), _obj("c")], "configmaps": [_obj("cm")]},
                   conflicts={"b"}, gone={"c"})
    lines: list[str] = []
    total = await rotate_all(c, ["secrets"], echo=lines.append)
    assert total == 2
    assert c.puts == [("secrets", "ns", "a"), ("secrets", "ns", "b")]
    assert c.gets == ["b"]
    assert lines == ["secrets: 2 rewritten"]


@pytest.mark.parametrize("names, expected", [
    (["*."], ["secrets", "configmaps"]),
    (["*.apps"], ["deployments"]),
    (["*.*"], ["secrets", "configmaps", "deployments"]),
    (["deployments.apps", "secrets"], ["deployments", "secrets"]),
])
async def test_wildcards_expand_through_discovery(names: list[str], expected: list[str]) -> None:
    c = FakeClient({p: [_obj(p + "-1")] for p in ("secrets", "configmaps", "deployments")}, set(), set())
    await rotate_all(c, names, echo=lambda _line: None)
    assert [p for p, _, _ in c.puts] == expected


async def test_a_persistent_conflict_is_an_error() -> None:
    class Always(FakeClient):
        async def replace(self, *a: Any, **kw: Any) -> dict[str, Any]:
            raise ApiException({"code": 409, "reason": "Conflict"}, 409)

    with pytest.raises(ApiException, match="Conflict"):
        await rotate_all(Always({"secrets": [_obj("a")]}, set(), set()), ["secrets"], echo=lambda _l: None)
