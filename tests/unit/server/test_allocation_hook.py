"""The generic allocation seam of the write path (fleet/server/allocation.py), with a
recording strategy on ConfigMaps: which hook runs when, and commit vs revert."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api import errors
from fleet.server.allocation import Transaction
from fleet.testing.apiserver import open_api

CMS = "/api/v1/namespaces/default/configmaps"


class Recording:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.refuse = False

    def _txn(self, what: str) -> Transaction:
        async def commit() -> None:
            self.calls.append(f"commit {what}")

        async def revert() -> None:
            self.calls.append(f"revert {what}")

        return Transaction(on_commit=[commit], on_revert=[revert])

    async def before_create(self, obj: dict[str, Any], *, dry_run: bool) -> Transaction:
        name = obj["metadata"]["name"]
        self.calls.append(f"create {name}{' dry' if dry_run else ''}")
        if self.refuse:
            raise errors.Invalid.for_object("ConfigMap", "", name, [errors.cause("data", "Invalid value: no")])
        obj.setdefault("data", {})["allocated"] = "yes"  # hooks may fill the object in
        return self._txn(name)

    async def before_update(self, old: dict[str, Any], new: dict[str, Any], *, dry_run: bool) -> Transaction:
        self.calls.append(f"update {new['metadata']['name']}")
        return self._txn(new["metadata"]["name"])

    async def after_delete(self, obj: dict[str, Any]) -> None:
        self.calls.append(f"deleted {obj['metadata']['name']}")


@pytest.fixture
async def api_and_hooks(tmp_path):
    async with open_api(tmp_path, namespace_controller=False, sync="OFF") as api:
        hooks = Recording()
        api.server.resources.allocators[("", "configmaps")] = hooks
        yield api, hooks


def cm(name: str, **md: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **md}}


async def test_create_commits_and_stores_what_the_hook_set(api_and_hooks):
    api, hooks = api_and_hooks
    code, body = await api.json("POST", CMS, cm("a"))
    assert code == 201 and body["data"] == {"allocated": "yes"}
    assert hooks.calls == ["create a", "commit a"]


async def test_failed_store_write_reverts(api_and_hooks):
    api, hooks = api_and_hooks
    await api.json("POST", CMS, cm("a"))
    hooks.calls.clear()
    code, _ = await api.json("POST", CMS, cm("a"))
    assert code == 409
    assert hooks.calls == ["create a", "revert a"]


async def test_hook_refusal_is_the_answer_and_nothing_is_stored(api_and_hooks):
    api, hooks = api_and_hooks
    hooks.refuse = True
    code, body = await api.json("POST", CMS, cm("a"))
    assert code == 422 and body["reason"] == "Invalid"
    assert (await api.json("GET", f"{CMS}/a"))[0] == 404


async def test_invalid_objects_never_reach_the_hook(api_and_hooks):
    api, hooks = api_and_hooks
    code, _ = await api.json("POST", CMS, cm("Not_Valid"))
    assert code == 422
    assert hooks.calls == []


async def test_dry_run_neither_commits_nor_reverts(api_and_hooks):
    api, hooks = api_and_hooks
    code, _ = await api.json("POST", CMS, cm("a"), query={"dryRun": "All"})
    assert code == 201
    assert hooks.calls == ["create a dry"]


async def test_update_then_delete(api_and_hooks):
    api, hooks = api_and_hooks
    await api.json("POST", CMS, cm("a"))
    code, _ = await api.json("PATCH", f"{CMS}/a", {"data": {"x": "1"}},
                             content_type="application/merge-patch+json")
    assert code == 200
    code, _ = await api.json("DELETE", f"{CMS}/a")
    assert code == 200
    assert hooks.calls == ["create a", "commit a", "update a", "commit a", "deleted a"]


async def test_stale_precondition_reverts(api_and_hooks):
    api, hooks = api_and_hooks
    _, a = await api.json("POST", CMS, cm("a"))
    await api.json("PATCH", f"{CMS}/a", {"data": {"x": "1"}}, content_type="application/merge-patch+json")
    hooks.calls.clear()
    stale = {**a, "data": {"x": "2"}}
    code, _ = await api.json("PUT", f"{CMS}/a", stale)
    assert code == 409
    assert hooks.calls == []  # refused before the hook: the precondition is checked on read


async def test_after_delete_waits_for_the_last_finalizer(api_and_hooks):
    api, hooks = api_and_hooks
    await api.json("POST", CMS, cm("a", finalizers=["example.com/x"]))
    code, _ = await api.json("DELETE", f"{CMS}/a")
    assert code == 200
    assert "deleted a" not in hooks.calls
    code, _ = await api.json("PATCH", f"{CMS}/a", {"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
    assert code == 200
    assert hooks.calls[-2:] == ["commit a", "deleted a"]


async def test_store_conflict_reverts_then_retries(api_and_hooks, monkeypatch):
    from fleet.store import RevisionConflict

    api, hooks = api_and_hooks
    await api.json("POST", CMS, cm("a"))
    hooks.calls.clear()
    real = api.store.update
    failures = [RevisionConflict("a concurrent writer")]

    async def update(*args: Any, **kw: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(*args, **kw)

    monkeypatch.setattr(api.store, "update", update)
    code, _ = await api.json("PATCH", f"{CMS}/a", {"data": {"x": "1"}}, content_type="application/merge-patch+json")
    assert code == 200
    assert hooks.calls == ["update a", "revert a", "update a", "commit a"]
