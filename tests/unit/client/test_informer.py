"""The one client informer (fleet.client.informer): one test per mechanism.

A fake client serves lists and watch streams from a script the test controls, so
each test decides exactly when the watch answers 410 Expired, when the connection
drops, and what the next list holds.  Time-dependent tests run under trio's
MockClock (autojump), so a resync period of minutes costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from fleet.client import ApiException
from fleet.client.informer import Informer, InformerFactory


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def pod(name: str, rv: int, *, uid: str | None = None, node: str = "n1", ns: str = "d") -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv),
                                        "uid": uid or f"uid-{name}"},
            "spec": {"nodeName": node}}


EXPIRED = ApiException({"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
                        "message": "too old resource version"}, 410)


class FakeClient:
    """`list_all` answers with the current objects; each `watch` call takes the next
    script from `streams`: a list of events, then (once `gate` is set, if given) an
    exception to raise, or None to block until cancelled — a healthy, idle watch."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objects: dict[str, dict[str, Any]] = {o["metadata"]["name"]: o for o in objs}
        self.rv = 10
        self.lists: list[dict[str, Any]] = []
        self.watches: list[dict[str, Any]] = []
        self.streams: list[tuple[list[dict[str, Any]], BaseException | None, trio.Event | None]] = []
        self.more = trio.Event()

    async def list_all(self, api_version: str, plural: str, namespace: str | None = None, *,
                       label_selector: str | None = None,
                       field_selector: str | None = None) -> dict[str, Any]:
        self.lists.append({"namespace": namespace, "label_selector": label_selector,
                           "field_selector": field_selector})
        return {"metadata": {"resourceVersion": str(self.rv)},
                "items": [dict(o) for o in self.objects.values()]}

    async def watch(self, api_version: str, plural: str, namespace: str | None = None, *,
                    resource_version: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None) -> AsyncIterator[dict[str, Any]]:
        self.watches.append({"rv": resource_version, "field_selector": field_selector,
                             "label_selector": label_selector})
        while not self.streams:
            self.more = trio.Event()
            await self.more.wait()
        events, end, gate = self.streams.pop(0)
        for e in events:
            yield e
        if gate is not None:
            await gate.wait()
        if end is not None:
            raise end
        await trio.sleep(math.inf)

    def script(self, events: list[dict[str, Any]], end: BaseException | None = None,
               gate: trio.Event | None = None) -> None:
        self.streams.append((events, end, gate))
        self.more.set()


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (etype, name, uid)

    def __call__(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        o = new if new is not None else old
        assert o is not None
        self.seen.append((etype, o["metadata"]["name"], o["metadata"]["uid"]))


async def test_relist_after_410_reports_objects_deleted_meanwhile(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1), pod("b", 2), pod("c", 3))
    rec = Recorder()
    inf = Informer(client, "v1", "pods", rec)  # type: ignore[arg-type]
    async with trio.open_nursery() as n:
        await n.start(inf.run)
        # The watch brings one change, then the server says our revision is gone; what
        # happened meanwhile the informer never saw as events: b deleted, c changed,
        # d created.
        client.objects["a"] = pod("a", 11)
        del client.objects["b"]
        client.objects["c"] = pod("c", 12)
        client.objects["d"] = pod("d", 13)
        client.script([{"type": "MODIFIED", "object": pod("a", 11)}], EXPIRED)
        client.script([])  # the watch after the relist: quiet
        await trio.sleep(1)
        assert len(client.lists) == 2 and inf.relists == 1
        n.cancel_scope.cancel()
    assert rec.seen == [("ADDED", "a", "uid-a"), ("ADDED", "b", "uid-b"), ("ADDED", "c", "uid-c"),
                        ("MODIFIED", "a", "uid-a"),
                        ("DELETED", "b", "uid-b"), ("MODIFIED", "c", "uid-c"), ("ADDED", "d", "uid-d")]
    assert sorted(inf.items) == ["d/a", "d/c", "d/d"]
    # The second watch starts from the second list's revision.
    assert [w["rv"] for w in client.watches] == ["10", "10"]


async def test_relist_after_a_lost_connection_and_a_recreated_object(
        autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1), pod("e", 2))
    rec = Recorder()
    inf = Informer(client, "v1", "pods", rec, retry_backoff=0.5)  # type: ignore[arg-type]
    async with trio.open_nursery() as n:
        await n.start(inf.run)
        del client.objects["a"]
        client.objects["e"] = pod("e", 20, uid="uid-e2")  # deleted and re-created
        client.script([], httpx.ReadError("connection lost"))
        client.script([])
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert rec.seen == [("ADDED", "a", "uid-a"), ("ADDED", "e", "uid-e"),
                        ("DELETED", "a", "uid-a"),
                        ("DELETED", "e", "uid-e"), ("ADDED", "e", "uid-e2")]
    assert inf.get("d/e")["metadata"]["uid"] == "uid-e2"  # type: ignore[index]


async def test_resync_redelivers_every_cached_object_every_period(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1), pod("b", 2))
    updates: list[tuple[float, str]] = []
    inf = Informer(client, "v1", "pods", resync_period=30.0)  # type: ignore[arg-type]

    def on_update(old: dict[str, Any], new: dict[str, Any]) -> None:
        assert old is new  # a resync: nothing changed
        updates.append((trio.current_time(), new["metadata"]["name"]))

    inf.add_event_handler(on_update=on_update)
    client.script([])
    async with trio.open_nursery() as n:
        start = trio.current_time()
        await n.start(inf.run)
        await trio.sleep(95)
        n.cancel_scope.cancel()
    assert [(round(t - start), name) for t, name in updates] == [
        (30, "a"), (30, "b"), (60, "a"), (60, "b"), (90, "a"), (90, "b")]


async def test_no_resync_by_default(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1))
    rec = Recorder()
    inf = Informer(client, "v1", "pods", rec)  # type: ignore[arg-type]
    client.script([])
    async with trio.open_nursery() as n:
        await n.start(inf.run)
        await trio.sleep(3600)
        n.cancel_scope.cancel()
    assert rec.seen == [("ADDED", "a", "uid-a")]


async def test_indexes_follow_lists_watch_events_and_relists(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1, node="n1"), pod("b", 2, node="n1"), pod("c", 3, node="n2", ns="e"))
    inf = Informer(client, "v1", "pods")  # type: ignore[arg-type]
    inf.add_index("node", lambda o: [o["spec"]["nodeName"]])

    def names(objs: list[dict[str, Any]]) -> list[str]:
        return sorted(o["metadata"]["name"] for o in objs)

    async with trio.open_nursery() as n:
        await n.start(inf.run)
        assert names(inf.by_index("node", "n1")) == ["a", "b"]
        expire = trio.Event()
        client.script([{"type": "MODIFIED", "object": pod("b", 4, node="n2")},
                       {"type": "DELETED", "object": pod("a", 5)}], EXPIRED, expire)
        await trio.sleep(1)
        assert names(inf.by_index("node", "n1")) == []
        assert names(inf.by_index("node", "n2")) == ["b", "c"]
        # What the relist after a 410 finds: b moved back, c gone.
        client.objects = {"b": pod("b", 6, node="n1")}
        client.script([])
        expire.set()
        await trio.sleep(1)
        n.cancel_scope.cancel()
    assert names(inf.by_index("node", "n1")) == ["b"]
    assert inf.by_index("node", "n2") == []
    assert names(inf.list("d")) == ["b"] and inf.list("e") == []
    # An index added late covers what is cached already.
    inf.add_index("uid", lambda o: [o["metadata"]["uid"]])
    assert names(inf.by_index("uid", "uid-b")) == ["b"]


async def test_wait_synced_returns_after_the_first_list(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1))
    fail_first = [True]
    real_list = client.list_all

    async def flaky_list(*args: Any, **kw: Any) -> dict[str, Any]:
        await trio.sleep(2)
        if fail_first.pop() if fail_first else False:
            raise httpx.ConnectError("server not up yet")
        return await real_list(*args, **kw)

    client.list_all = flaky_list  # type: ignore[method-assign]
    inf = Informer(client, "v1", "pods", retry_backoff=1.0)  # type: ignore[arg-type]
    client.script([])
    synced_at: list[float] = []

    async def waiter() -> None:
        await inf.wait_synced()
        synced_at.append(trio.current_time())
        assert inf.get("d/a") is not None  # the cache is filled when it returns

    async with trio.open_nursery() as n:
        start = trio.current_time()
        n.start_soon(waiter)
        n.start_soon(inf.run)
        await trio.sleep(0.5)
        assert not inf.has_synced and synced_at == []
        await trio.sleep(10)
        n.cancel_scope.cancel()
    # A failed list (2 s), the back-off (1 s), a good list (2 s).
    assert [round(t - start) for t in synced_at] == [5]
    assert inf.has_synced


async def test_selectors_reach_the_list_and_the_watch(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient()
    inf = Informer(client, "v1", "pods", namespace="d", field_selector="spec.nodeName=n1",  # type: ignore[arg-type]
                   label_selector="app=web")
    client.script([])
    async with trio.open_nursery() as n:
        await n.start(inf.run)
        n.cancel_scope.cancel()
    assert client.lists == [{"namespace": "d", "label_selector": "app=web", "field_selector": "spec.nodeName=n1"}]
    assert client.watches == [{"rv": "10", "field_selector": "spec.nodeName=n1", "label_selector": "app=web"}]


async def test_handlers_feed_a_work_queue_and_one_failing_handler_spares_the_rest(
        autojump_clock: trio.testing.MockClock) -> None:
    from fleet.controllers.runtime import WorkQueue

    client = FakeClient(pod("a", 1))
    q = WorkQueue(name="unit-informer-queue")
    inf = Informer(client, "v1", "pods", component="unit-informer-q")  # type: ignore[arg-type]

    def broken(etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        raise RuntimeError("handler bug")

    inf.add_handler(broken)
    inf.add_event_handler(on_add=lambda o: q.add(o["metadata"]["name"]),
                          on_update=lambda old, new: q.add(new["metadata"]["name"]),
                          on_delete=lambda o: q.add("gone:" + o["metadata"]["name"]))
    client.script([{"type": "ADDED", "object": pod("b", 2)}, {"type": "DELETED", "object": pod("a", 3)}])
    async with trio.open_nursery() as n:
        await n.start(inf.run)
        got = [await q.get() for _ in range(3)]
        n.cancel_scope.cancel()
    assert got == ["a", "b", "gone:a"]


async def test_factory_shares_one_informer_per_resource(autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1))
    f = InformerFactory(client)  # type: ignore[arg-type]
    one = f.informer("v1", "pods")
    assert f.informer("v1", "pods") is one
    assert f.informer("v1", "pods", field_selector="spec.nodeName=x") is not one
    client.script([])
    client.script([])
    async with trio.open_nursery() as n:
        await n.start(f.run)
        assert one.has_synced and one.get("d/a") is not None
        n.cancel_scope.cancel()
