"""The controller runtime's queue, expectations and informer indexes (MockClock, no server)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from fleet.api.owners import controller_of
from fleet.controllers.runtime import (
    Expectations,
    QueueWorker,
    SharedInformer,
    WorkQueue,
    by_controller_uid,
)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_queue_dedupes_and_is_fifo(autojump_clock):
    q = WorkQueue()
    for k in ("a", "b", "a", "c", "b"):
        q.add(k)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_key_added_while_processing_comes_back_after_done(autojump_clock):
    q = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")  # changed while reconciling: not handed to a second worker now
    with trio.move_on_after(1) as cs:
        await q.get()
    assert cs.cancelled_caught
    q.done("a")
    assert await q.get() == "a"


async def test_rate_limited_backs_off_exponentially_and_forget_resets(autojump_clock):
    q = WorkQueue(base_delay=1.0, max_delay=4.0)
    times = []
    for _ in range(4):
        q.add_rate_limited("k")
        t0 = trio.current_time()
        assert await q.get() == "k"
        q.done("k")
        times.append(trio.current_time() - t0)
    assert times == [1.0, 2.0, 4.0, 4.0]
    q.forget("k")
    q.add_rate_limited("k")
    t0 = trio.current_time()
    await q.get()
    assert trio.current_time() - t0 == 1.0


async def test_add_after(autojump_clock):
    q = WorkQueue()
    q.add_after("later", 30)
    q.add("now")
    assert await q.get() == "now"
    t0 = trio.current_time()
    assert await q.get() == "later"
    assert trio.current_time() - t0 == pytest.approx(30)


async def test_expectations(autojump_clock):
    e = Expectations(ttl=300)
    assert e.satisfied("rs")
    e.expect_creations("rs", 2)
    e.expect_deletions("rs", ["u1"])
    assert not e.satisfied("rs")
    e.creation_observed("rs")
    e.creation_failed("rs")
    assert not e.satisfied("rs")
    e.deletion_observed("rs", "u1")
    assert e.satisfied("rs")
    e.expect_creations("rs", 1)
    await trio.sleep(301)
    assert e.satisfied("rs")  # a lost event must not wedge the controller


def obj(name: str, owner: str | None = None, ns: str = "d") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": "1"}
    if owner:
        md["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "uid": f"uid-{owner}",
                                  "controller": True}]
    return {"metadata": md}


def test_informer_indexes_follow_events():
    inf = SharedInformer(None, "v1", "pods")  # type: ignore[arg-type]
    inf.add_index("owner", by_controller_uid)
    inf.add_index("namespace", lambda o: [o["metadata"]["namespace"]])
    seen = []
    inf.add_handler(lambda t, old, new: seen.append(t))
    inf._apply("ADDED", obj("a", "rs1"))
    inf._apply("ADDED", obj("b", "rs1"))
    inf._apply("ADDED", obj("c", "rs2", ns="e"))
    assert sorted(o["metadata"]["name"] for o in inf.by_index("owner", "uid-rs1")) == ["a", "b"]
    inf._apply("MODIFIED", obj("b", "rs2"))  # adopted by another owner
    assert [o["metadata"]["name"] for o in inf.by_index("owner", "uid-rs1")] == ["a"]
    assert sorted(o["metadata"]["name"] for o in inf.by_index("owner", "uid-rs2")) == ["b", "c"]
    inf._apply("DELETED", obj("a", "rs1"))
    assert inf.by_index("owner", "uid-rs1") == []
    assert [o["metadata"]["name"] for o in inf.by_index("namespace", "e")] == ["c"]
    assert seen == ["ADDED", "ADDED", "ADDED", "MODIFIED", "DELETED"]
    assert controller_of(obj("x", "rs9"))["uid"] == "uid-rs9"  # type: ignore[index]


async def test_queue_worker_retries_failures_and_requeues(autojump_clock):
    calls: list[tuple[str, float]] = []

    class W(QueueWorker):
        name = "test"
        workers = 2

        async def reconcile(self, key: str) -> float | None:
            calls.append((key, trio.current_time()))
            n = sum(1 for k, _ in calls if k == key)
            if key == "flaky" and n < 3:
                raise RuntimeError("not yet")
            if key == "periodic" and n < 2:
                return 10.0
            return None

    w = W()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run, None)
        w.queue.add("flaky")
        w.queue.add("periodic")
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert [k for k, _ in calls].count("flaky") == 3
    assert [k for k, _ in calls].count("periodic") == 2
    periodic = [t for k, t in calls if k == "periodic"]
    assert periodic[1] - periodic[0] == pytest.approx(10.0)
    assert w.queue.failures("flaky") == 0
