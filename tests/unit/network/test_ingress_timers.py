"""Coarse timeouts of the built-in ingress proxy (ingress_timers): which timers fire, and
that firing wakes a task waiting on the timer's socket."""

from __future__ import annotations

import math

import pytest
import trio

from fleet.network.ingress_timers import (
    MAX_RESOLUTION,
    MIN_RESOLUTION,
    Timer,
    Timers,
    resolution_for,
)


@pytest.mark.parametrize(("timeouts", "expected"), [
    ([75.0, 60.0], MAX_RESOLUTION),  # long timeouts: the coarsest check
    ([75.0, 60.0, 1.0], 0.1),  # a tenth of the shortest
    ([0.05], MIN_RESOLUTION),  # bounded below
    ([0.0, 2.0], 0.2),  # 0 (no timeout) is ignored
    ([], MAX_RESOLUTION),
])
def test_resolution(timeouts: list[float], expected: float) -> None:
    assert resolution_for(timeouts) == pytest.approx(expected)


def test_only_armed_timers_past_their_deadline_fire() -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        with a, b:
            timers = Timers()
            due, later, disarmed = Timer(a), Timer(a), Timer(b)
            timers.arm(due, 10.0)
            timers.arm(later, 20.0)
            timers.arm(disarmed, 5.0)
            timers.disarm(disarmed)
            assert disarmed.deadline == math.inf and len(timers) == 2
            assert timers.expire(9.9) == []
            assert timers.expire(10.0) == [due] and due.expired and not later.expired
            assert timers.expire(10.5) == [due]  # still armed: fires again (a wait begun since is woken too)
            timers.disarm(due)
            assert timers.expire(30.0) == [later] and not disarmed.expired
            timers.arm(later, 40.0)  # re-arming clears the mark
            assert not later.expired
    trio.run(main)


def test_firing_wakes_the_waiting_reader() -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        with a, b:
            timers = Timers(resolution=0.02)
            timer = Timer(a)
            woke: list[BaseException] = []

            async def reader() -> None:
                timers.arm(timer, trio.current_time() + 0.1)
                try:
                    await trio.lowlevel.wait_readable(a)
                except trio.ClosedResourceError as e:
                    woke.append(e)
                finally:
                    timers.disarm(timer)

            start = trio.current_time()
            with trio.fail_after(5):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(timers.run)
                    await reader()
                    nursery.cancel_scope.cancel()
            took = trio.current_time() - start
            assert woke and timer.expired
            assert 0.1 <= took < 0.1 + 0.02 + 0.5  # within one resolution (plus scheduling slack)
            assert len(timers) == 0
    trio.run(main)


def test_a_closed_socket_is_dropped() -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        b.close()
        a.close()
        timers = Timers()
        t = Timer(a)
        timers.arm(t, 1.0)
        assert timers.expire(2.0) == [t] and t.expired
        assert len(timers) == 0
    trio.run(main)
