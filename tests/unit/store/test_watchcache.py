"""fleet.store.watchcache.WatchCache: list + watch into a keyed, indexed cache."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from fleet.api import meta
from fleet.store import RevisionCompacted, open_store
from fleet.store.base import Event, ListResult
from fleet.store.watchcache import WatchCache, by_namespace, cache_key

PREFIX = meta.store_key("", "configmaps", None)


def cm(name: str, ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns,
                                                                  "labels": labels}}


@pytest.mark.parametrize(("obj", "key"), [
    (cm("a"), "default/a"),
    ({"metadata": {"name": "n"}}, "n"),
    ({"metadata": {"name": "n", "namespace": ""}}, "n"),
    ({"metadata": {"name": ""}}, None),
    ({"metadata": {"name": 5}}, None),
    ({"metadata": {"name": "n", "namespace": 7}}, None),
    ({"metadata": 5}, None),
    (5, None),
])
def test_cache_key(obj: Any, key: str | None) -> None:
    assert cache_key(obj) == key


def test_indexes_follow_puts_updates_and_drops() -> None:
    c = WatchCache(PREFIX, indexes={"namespace": by_namespace,
                                    "app": lambda o: [o["metadata"]["labels"]["app"]]})
    c.replace([cm("a", app="web"), cm("b", "other", app="web"), {"metadata": {"name": 5}}])
    assert sorted(c) == ["default/a", "other/b"]  # the nameless object is left out
    assert [o["metadata"]["name"] for o in c.by_index("app", "web")] == ["a", "b"]
    c.put(cm("a", app="db"))  # an update moves it between index values
    assert [o["metadata"]["name"] for o in c.by_index("app", "web")] == ["b"]
    assert [o["metadata"]["name"] for o in c.by_index("app", "db")] == ["a"]
    c.put(cm("c"))  # the app index trips (no label): indexed by namespace, skipped by app
    assert [o["metadata"]["name"] for o in c.by_index("namespace", "default")] == ["a", "c"]
    c.drop(cm("b", "other"))
    assert c.by_index("namespace", "other") == [] and "other/b" not in c
    assert c.by_index("app", "nothing") == []


async def test_run_lists_watches_and_follows_a_real_store(tmp_path) -> None:
    async with open_store(tmp_path / "fleet.db") as store:
        await store.create(meta.store_key("", "configmaps", "default", "a"), cm("a"))
        c = WatchCache(PREFIX, indexes={"namespace": by_namespace})
        async with trio.open_nursery() as nursery:
            await nursery.start(c.run, store)
            assert c.synced and list(c) == ["default/a"]
            await store.create(meta.store_key("", "configmaps", "ns2", "b"), cm("b", "ns2"))
            old = c["default/a"]
            await store.update(meta.store_key("", "configmaps", "default", "a"), cm("a", x="1"),
                               expected_revision=int(old["metadata"]["resourceVersion"]))
            await store.delete(meta.store_key("", "configmaps", "ns2", "b"))
            with trio.fail_after(5):
                while "ns2/b" in c or c["default/a"]["metadata"]["labels"] != {"x": "1"} or \
                        c.by_index("namespace", "ns2"):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


class FlakyStore:
    """A store whose first watch fails as a compacted one does (the cache must re-list)."""

    def __init__(self) -> None:
        self.lists = 0
        self.items = [cm("a")]

    async def list(self, prefix: str, **kw: Any) -> ListResult:
        self.lists += 1
        return ListResult(items=list(self.items), revision=self.lists)

    async def watch(self, prefix: str, *, from_revision: int) -> Any:
        store = self

        class W:
            progress = from_revision

            def __aiter__(self) -> W:
                return self

            async def __anext__(self) -> Event:
                if store.lists == 1:
                    store.items = [cm("b")]  # what changed while the watch was broken
                    raise RevisionCompacted(from_revision, from_revision + 1)
                await trio.sleep_forever()
                raise AssertionError

            async def aclose(self) -> None:
                pass

        return W()


async def test_relists_after_a_watch_error() -> None:
    store = FlakyStore()
    c = WatchCache(PREFIX, relist_delay=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(c.run, store)
        with trio.fail_after(5):
            while store.lists < 2 or list(c) != ["default/b"]:
                await trio.sleep(0.01)
        assert c.synced
        nursery.cancel_scope.cancel()

