"""SqliteStore.list refuses what no honest caller passes, instead of a 500 deeper down:
a limit or revision SQLite cannot bind, a revision from the future, a start key
outside the listed prefix."""

from __future__ import annotations

import pytest

from fleet.store import RevisionTooLarge, SqliteStore

from .helpers import key, pod


@pytest.mark.parametrize("kw", [
    {"limit": 2**63},  # does not fit an int64: OverflowError from sqlite3 before
    {"limit": 2**64},
    {"limit": -1},
    {"revision": -1},
    {"revision": 2**63},
    {"start_after": "/core/secrets/default/x"},  # another list's key
    {"start_after": "/core/pods/other/x"},
])
async def test_out_of_range_arguments_are_value_errors(store: SqliteStore, kw: dict) -> None:
    await store.create(key("a"), pod("a"))
    with pytest.raises(ValueError):
        await store.list("/core/pods/default/", **kw)


async def test_future_revision_is_refused(store: SqliteStore) -> None:
    await store.create(key("a"), pod("a"))
    now = store.current_revision()
    assert (await store.list("/core/pods/default/", revision=now)).revision == now
    with pytest.raises(RevisionTooLarge) as e:
        await store.list("/core/pods/default/", revision=now + 1)
    assert e.value.requested == now + 1 and e.value.current == now
    with pytest.raises(RevisionTooLarge):
        await store.list("/core/pods/default/", revision=2**63 - 1, limit=1)


async def test_largest_limit_still_lists(store: SqliteStore) -> None:
    await store.create(key("a"), pod("a"))
    res = await store.list("/core/pods/default/", limit=2**63 - 1)  # `limit + 1` was bound before
    assert [o["metadata"]["name"] for o in res.items] == ["a"] and res.continue_key is None
