"""The work queue's metrics hooks (what bench/controllers.py reads), under MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from fleet.controllers.runtime import QueueWorker, WorkQueue, queue_stats


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_queue_latency_is_add_to_get(autojump_clock: trio.testing.MockClock) -> None:
    q = WorkQueue(name="test-latency")
    q.add("a")
    q.add("a")  # a duplicate is not a second add, and does not reset the clock
    await trio.sleep(2)
    q.add("b")
    assert await q.get() == "a"
    assert await q.get() == "b"
    m = q.metrics
    assert m.adds == 2
    assert list(m.queue_latency) == [2.0, 0.0]
    q.add_rate_limited("a")
    assert m.retries == 1
    snap = queue_stats()["test-latency"]
    assert snap["queue_latency_s"]["max"] == 2.0 and snap["depth"] == 0


async def test_worker_counts_reconciles_and_their_duration(
        autojump_clock: trio.testing.MockClock) -> None:
    class Slow(QueueWorker):
        name = "test-slow"
        workers = 1

        async def reconcile(self, key: str) -> float | None:
            await trio.sleep(3)
            return None

    w = Slow()
    async with trio.open_nursery() as n:
        n.start_soon(w.run, None)
        w.queue.add("k")
        await trio.sleep(10)
        n.cancel_scope.cancel()
    snap = w.queue.metrics.snapshot()
    assert snap["processed"] == 1
    assert snap["work_duration_s"]["p99"] == 3.0
