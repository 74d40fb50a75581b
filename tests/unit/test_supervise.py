"""fleet._core.supervise: restart with capped exponential back-off, under MockClock."""

from __future__ import annotations

import itertools
import logging
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from fleet._core.supervise import Backoff, object_errors, object_failed, restarts, retry, supervise

_names = itertools.count()


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Boom(Exception):
    pass


class Scripted:
    """A component whose n-th run follows script[n]:
    ("early",) raises before `started`; ("after", s) raises s seconds after it;
    ("forever",) runs until cancelled; ("return",) returns right after `started`."""

    def __init__(self, script: list[tuple[Any, ...]]) -> None:
        self.script = script
        self.runs: list[float] = []  # trio time each run began

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        n = len(self.runs)
        self.runs.append(trio.current_time())
        step = self.script[n] if n < len(self.script) else ("forever",)
        if step[0] == "early":
            raise Boom(f"run {n} before start")
        task_status.started(f"run-{n}")
        if step[0] == "after":
            await trio.sleep(step[1])
            raise Boom(f"run {n}")
        if step[0] == "return":
            return
        await trio.sleep_forever()


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


QUICK = ("after", 0)

# (case, script, back-off, expected gaps between the starts of consecutive runs)
CASES = [
    ("one failure waits the initial delay", [QUICK], Backoff(), [1]),
    ("delays double", [QUICK] * 4, Backoff(), [1, 2, 4, 8]),
    ("delays are capped", [QUICK] * 8, Backoff(initial=1, maximum=60), [1, 2, 4, 8, 16, 32, 60, 60]),
    ("a custom initial and cap", [QUICK] * 4, Backoff(initial=0.5, maximum=1.5), [0.5, 1, 1.5, 1.5]),
    # Runs 0 and 1 fail at once (waits 1, 2); run 2 stays up 100 s ≥ healthy_after, so its
    # failure counts as the first again (wait 1) and the next quick one doubles (wait 2).
    ("a healthy run resets the back-off", [QUICK, QUICK, ("after", 100), QUICK],
     Backoff(healthy_after=60), [1, 2, 100 + 1, 2]),
    ("a short run does not reset it", [QUICK, ("after", 10), QUICK], Backoff(healthy_after=60),
     [1, 10 + 2, 4]),
    ("failures before the first start back off too", [("early",), ("early",), ("early",)], Backoff(),
     [1, 2, 4]),
]


@pytest.mark.parametrize(("case", "script", "backoff", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_restart_backoff(autojump_clock: trio.testing.MockClock, case: str, script: list[tuple[Any, ...]],
                               backoff: Backoff, expected: list[float]) -> None:
    name = f"test-{next(_names)}"
    comp = Scripted(script)
    async with trio.open_nursery() as n:
        await n.start(partial(supervise, name, comp.run, backoff=backoff))
        with trio.fail_after(10_000):
            while len(comp.runs) < len(script) + 1:  # every scripted run, then the healthy one
                await trio.sleep(0.5)
        n.cancel_scope.cancel()
    assert gaps(comp.runs) == expected
    assert restarts(name) == len(script)


async def test_first_start_waits_for_a_successful_start(autojump_clock: trio.testing.MockClock) -> None:
    comp = Scripted([("early",), ("early",)])
    async with trio.open_nursery() as n:
        t0 = trio.current_time()
        value = await n.start(supervise, f"test-{next(_names)}", comp.run)
        # The caller got the third run's start value, after the 1 s and 2 s back-offs.
        assert value == "run-2"
        assert trio.current_time() - t0 == pytest.approx(3)
        n.cancel_scope.cancel()


async def test_later_restarts_do_not_start_again(autojump_clock: trio.testing.MockClock) -> None:
    comp = Scripted([QUICK, QUICK])
    async with trio.open_nursery() as n:
        assert await n.start(supervise, f"test-{next(_names)}", comp.run) == "run-0"
        await trio.sleep(10)  # both restarts happen; started() is not called twice (trio would raise)
        assert len(comp.runs) == 3
        n.cancel_scope.cancel()


async def test_cancellation_is_not_a_failure(autojump_clock: trio.testing.MockClock) -> None:
    name = f"test-{next(_names)}"
    comp = Scripted([("forever",)])
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as n:
            await n.start(supervise, name, comp.run)
            await trio.sleep(1)
            n.cancel_scope.cancel()
    assert not scope.cancelled_caught  # the supervisor left at once, it did not restart
    assert len(comp.runs) == 1
    assert restarts(name) == 0


async def test_cancelled_during_backoff_stops(autojump_clock: trio.testing.MockClock) -> None:
    name = f"test-{next(_names)}"
    comp = Scripted([("after", 0)])
    with trio.move_on_after(0.5):  # the failure at t=0 schedules a restart at t=1
        await supervise(name, comp.run)
    assert len(comp.runs) == 1
    assert restarts(name) == 1


async def test_normal_return_ends_supervision(autojump_clock: trio.testing.MockClock) -> None:
    name = f"test-{next(_names)}"
    comp = Scripted([("return",)])
    with trio.fail_after(1):
        await supervise(name, comp.run)
    assert len(comp.runs) == 1
    assert restarts(name) == 0


async def test_without_task_status(autojump_clock: trio.testing.MockClock) -> None:
    runs: list[float] = []

    async def plain() -> None:
        runs.append(trio.current_time())
        if len(runs) < 3:
            raise Boom("plain")
        await trio.sleep_forever()

    async with trio.open_nursery() as n:
        assert await n.start(lambda task_status: supervise(
            "plain", plain, uses_task_status=False, task_status=task_status)) is None
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert gaps(runs) == [1, 2]


async def test_failure_is_logged_with_the_component_name(autojump_clock: trio.testing.MockClock,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    comp = Scripted([QUICK])
    with caplog.at_level(logging.ERROR, logger="fleet._core.supervise"):
        with trio.move_on_after(0.5):
            await supervise("my-component", comp.run)
    [record] = [r for r in caplog.records if r.name == "fleet._core.supervise"]
    assert "my-component" in record.getMessage()
    assert "Boom('run 0')" in record.getMessage()  # the exception itself, not its nursery's group


def test_object_failed_logs_the_key_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    before = object_errors("unit-test", "Pod")
    with caplog.at_level(logging.WARNING, logger="fleet._core.supervise"):
        object_failed("unit-test", "Pod", "default/bad", AttributeError("'int' object has no attribute 'get'"))
    assert object_errors("unit-test", "Pod") == before + 1
    msg = caplog.records[-1].getMessage()
    assert "unit-test" in msg and "Pod default/bad" in msg and "has no attribute" in msg


async def test_retry_start_false_propagates_a_start_failure(autojump_clock: trio.testing.MockClock) -> None:
    name = f"test-{next(_names)}"
    comp = Scripted([("early",)])
    with pytest.RaisesGroup(Boom, allow_unwrapped=True, flatten_subgroups=True):
        await supervise(name, comp.run, retry_start=False)
    assert len(comp.runs) == 1 and restarts(name) == 0


async def test_retry_start_false_still_restarts_after_the_first_start(
        autojump_clock: trio.testing.MockClock) -> None:
    name = f"test-{next(_names)}"
    comp = Scripted([QUICK])
    async with trio.open_nursery() as n:
        await n.start(partial(supervise, name, comp.run, retry_start=False))
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert len(comp.runs) == 2 and restarts(name) == 1


async def test_retry_waits_the_back_off_between_listed_errors_and_returns(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    tries: list[float] = []

    async def flaky() -> str:
        tries.append(trio.current_time())
        if len(tries) < 4:
            raise OSError("not yet")
        return "done"

    start = trio.current_time()
    with caplog.at_level(logging.WARNING):
        assert await retry("the thing", flaky, (OSError,), backoff=Backoff(initial=1, maximum=3)) == "done"
    assert [round(t - start) for t in tries] == [0, 1, 3, 6]  # 1, 2, then capped at 3
    assert caplog.text.count("the thing: not yet; retrying in") == 3


async def test_retry_lets_other_errors_through(autojump_clock: trio.testing.MockClock) -> None:
    async def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await retry("x", broken, (OSError,))
