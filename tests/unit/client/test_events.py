"""fleet.client.events.EventRecorder: correlation, aggregation, rate limit, ordering, drops."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from fleet.client import ApiException
from fleet.client.events import COMBINED, EventRecorder, dropped

RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
      "metadata": {"name": "web-1", "namespace": "ns1", "uid": "rs-1", "resourceVersion": "7"}}


class FakeClient:
    def __init__(self, delay: float = 0.0) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.delay = delay
        self.fail_create: Exception | None = None

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        if self.delay:
            await trio.sleep(self.delay)
        if self.fail_create is not None:
            raise self.fail_create
        self.created.append(body)
        return body

    async def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any], ctype: str,
                    namespace: str | None = None) -> dict[str, Any]:
        self.patched.append((name, body))
        return body


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_event_shape_for_any_kind() -> None:
    c = FakeClient()
    rec = EventRecorder(c, "unit-a", host="node-1")
    await rec.write_now(RS, "Normal", "SuccessfulCreate", "Created pod: web-1-abc")
    (ev,) = c.created
    assert ev["involvedObject"] == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                                    "namespace": "ns1", "uid": "rs-1", "resourceVersion": "7"}
    assert ev["source"] == {"component": "unit-a", "host": "node-1"}
    assert (ev["reportingComponent"], ev["reportingInstance"]) == ("unit-a", "node-1")
    assert ev["count"] == 1 and ev["firstTimestamp"] == ev["lastTimestamp"]


async def test_correlation_bumps_the_count_of_a_repeat() -> None:
    c = FakeClient()
    rec = EventRecorder(c, "unit-b")
    for _ in range(3):
        await rec.write_now(RS, "Warning", "FailedCreate", "quota exceeded")
    assert len(c.created) == 1
    assert [b["count"] for _, b in c.patched] == [2, 3]


async def test_aggregation_combines_similar_events_after_ten_messages() -> None:
    c = FakeClient()
    rec = EventRecorder(c, "unit-c", burst=100)
    for i in range(15):
        await rec.write_now(RS, "Normal", "SuccessfulCreate", f"Created pod: web-1-{i}")
    # Ten different messages are ten events; the rest fold into one combined event.
    assert len(c.created) == 11
    assert c.created[-1]["message"] == COMBINED + "Created pod: web-1-10"
    assert [b["count"] for _, b in c.patched] == [2, 3, 4, 5]
    assert c.patched[-1][1]["message"] == COMBINED + "Created pod: web-1-14"


async def test_rate_limit_per_object_is_counted(autojump: trio.testing.MockClock) -> None:
    c = FakeClient()
    rec = EventRecorder(c, "unit-d", burst=3, refill_seconds=10, aggregate_after=100)
    for i in range(5):
        rec.record(RS, "Normal", "R", f"m{i}")
    other = {**RS, "metadata": {**RS["metadata"], "uid": "rs-2", "name": "web-2"}}
    rec.record(other, "Normal", "R", "x")  # its own budget
    async with trio.open_nursery() as n:
        await n.start(rec.run)
        await trio.sleep(1)
        n.cancel_scope.cancel()
    assert sorted(e["message"] for e in c.created) == ["m0", "m1", "m2", "x"]
    assert dropped("unit-d", "rate_limit") == 2 and rec.dropped == 2


async def test_queued_before_run_and_ordered_per_object(autojump: trio.testing.MockClock) -> None:
    c = FakeClient(delay=0.01)
    rec = EventRecorder(c, "unit-e", burst=100, aggregate_after=100, senders=4)
    for i in range(20):
        rec.record(RS, "Normal", "Step", f"{i}")
    async with trio.open_nursery() as n:
        await n.start(rec.run)
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert [e["message"] for e in c.created] == [str(i) for i in range(20)]


async def test_queue_full_and_errors_are_counted_never_raised(autojump: trio.testing.MockClock) -> None:
    c = FakeClient()
    rec = EventRecorder(c, "unit-f", queue_size=2, burst=100, aggregate_after=100)
    for i in range(5):
        rec.record(RS, "Normal", "R", f"m{i}")
    assert dropped("unit-f", "queue_full") == 3
    c.fail_create = ApiException({"reason": "Forbidden"}, 403)
    await rec.write_now(RS, "Normal", "R", "forbidden")
    c.fail_create = RuntimeError("connection refused")
    await rec.write_now(RS, "Normal", "R", "refused")
    assert dropped("unit-f", "error") == 2
    rec.record({"metadata": 5}, "Normal", "R", "malformed")  # never raises
    await rec.write_now({}, "Normal", "R", "empty")


async def test_slow_api_times_out_and_counts(autojump: trio.testing.MockClock) -> None:
    rec = EventRecorder(FakeClient(delay=100), "unit-g", timeout=2)
    t0 = trio.current_time()
    await rec.write_now(RS, "Normal", "R", "slow")
    assert trio.current_time() - t0 == pytest.approx(2)
    assert dropped("unit-g", "timeout") == 1


async def test_each_sender_uses_its_own_client(autojump: trio.testing.MockClock) -> None:
    clients = [FakeClient(delay=0.1), FakeClient(delay=0.1)]
    rec = EventRecorder(FakeClient(), "unit-h", senders=2, sender_clients=clients)
    for i in range(4):
        rec.record({**RS, "metadata": {**RS["metadata"], "uid": f"u{i}", "name": f"p{i}"}}, "Normal", "R", "m")
    async with trio.open_nursery() as n:
        await n.start(rec.run)
        await trio.sleep(2)
        n.cancel_scope.cancel()
    assert sorted(len(c.created) for c in clients) == [2, 2]
