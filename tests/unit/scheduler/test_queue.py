"""The scheduling queue under Trio's MockClock: back-off, parking, moving on cluster events."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from fleet.scheduler.queue import ACTIVE, BACKOFF, IN_FLIGHT, UNSCHEDULABLE, SchedulingQueue


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def queue() -> SchedulingQueue:
    return SchedulingQueue(initial_backoff=1.0, max_backoff=8.0, unschedulable_timeout=60.0)


async def test_fifo_and_dedup(autojump_clock):
    q = queue()
    for k in ("a", "b", "a", "c"):
        q.add(k)
    assert [await q.pop() for _ in range(3)] == ["a", "b", "c"]
    assert q.where("a") == IN_FLIGHT
    q.add("a")  # being scheduled already: not queued twice
    with trio.move_on_after(100) as cs:
        await q.pop()
    assert cs.cancelled_caught


async def test_pop_waits_for_add(autojump_clock):
    q = queue()
    async with trio.open_nursery() as n:
        async def later() -> None:
            await trio.sleep(5)
            q.add("x")
        n.start_soon(later)
        t0 = trio.current_time()
        assert await q.pop() == "x"
        assert trio.current_time() - t0 == pytest.approx(5)


async def test_unschedulable_waits_for_a_cluster_event_not_a_timer(autojump_clock):
    q = queue()
    q.add("p")
    await q.pop()
    q.add_unschedulable("p")
    assert q.where("p") == UNSCHEDULABLE
    with trio.move_on_after(30) as cs:
        await q.pop()
    assert cs.cancelled_caught  # no busy retry
    t0 = trio.current_time()
    q.move_all()  # its 1 s back-off is long over: straight to active
    assert q.where("p") == ACTIVE
    assert await q.pop() == "p" and trio.current_time() == t0


async def test_cluster_event_inside_backoff_window_goes_through_backoff(autojump_clock):
    q = queue()
    q.add("p")
    await q.pop()
    q.add_unschedulable("p")  # attempt 1: 1 s
    q.move_all()
    assert q.where("p") == BACKOFF
    t0 = trio.current_time()
    assert await q.pop() == "p"
    assert trio.current_time() - t0 == pytest.approx(1.0)


async def test_backoff_doubles_and_caps(autojump_clock):
    q = queue()
    q.add("p")
    waits = []
    await q.pop()
    for _ in range(6):
        q.add_backoff("p")
        t0 = trio.current_time()
        assert await q.pop() == "p"
        waits.append(trio.current_time() - t0)
    assert waits == pytest.approx([1, 2, 4, 8, 8, 8])
    q.done("p")
    q.add("p")  # a fresh pod under the same name starts over
    t0 = trio.current_time()
    await q.pop()
    assert trio.current_time() == t0


async def test_parked_pods_are_retried_after_the_timeout(autojump_clock):
    q = queue()
    q.add("p")
    await q.pop()
    t0 = trio.current_time()
    q.add_unschedulable("p")
    assert await q.pop() == "p"
    assert trio.current_time() - t0 == pytest.approx(60.0)


async def test_pod_update_while_parked_retries_it(autojump_clock):
    q = queue()
    q.add("p")
    await q.pop()
    q.add_unschedulable("p")
    await trio.sleep(2)
    q.add("p")  # e.g. its nodeSelector changed
    assert q.where("p") == ACTIVE


async def test_deleted_pods_never_come_back(autojump_clock):
    q = queue()
    q.add("gone")
    q.add("kept")
    q.delete("gone")
    assert await q.pop() == "kept"
    q.add_unschedulable("gone")  # a late result for a deleted pod is ignored
    q.add_backoff("gone")
    assert len(q) == 1


async def test_higher_priority_first_fifo_among_equals(autojump_clock):
    q = queue()
    q.add("low-1", 0)
    q.add("high-1", 1000)
    q.add("low-2", 0)
    q.add("high-2", 1000)
    q.add("mid", 10)
    assert [await q.pop() for _ in range(5)] == ["high-1", "high-2", "mid", "low-1", "low-2"]


async def test_priority_change_resorts_an_active_pod(autojump_clock):
    q = queue()
    q.add("a", 0)
    q.add("b", 0)
    q.add("b", 5)  # its PriorityClass was resolved/changed: b now goes first, once
    assert [await q.pop() for _ in range(2)] == ["b", "a"]
    with trio.move_on_after(10) as cs:
        await q.pop()
    assert cs.cancelled_caught  # the stale heap row was not served again


async def test_parked_pods_time_out_oldest_first(autojump_clock):
    q = queue()
    for k in ("a", "b"):
        q.add(k)
        await q.pop()
        q.add_unschedulable(k)
        await trio.sleep(10)
    t0 = trio.current_time()
    assert await q.pop() == "a"  # parked at t0-20: 60 s safety net
    assert trio.current_time() - t0 == pytest.approx(40)
    assert await q.pop() == "b"
    assert trio.current_time() - t0 == pytest.approx(50)
    assert q.counts() == {ACTIVE: 0, BACKOFF: 0, UNSCHEDULABLE: 0, IN_FLIGHT: 2}
