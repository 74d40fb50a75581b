"""fleet.agent.events.EventRecorder against a fake API client."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
import trio.testing

from fleet.agent.events import EventRecorder
from fleet.client import MERGE_PATCH, ApiException

POD = {"metadata": {"name": "web-1", "namespace": "ns1", "uid": "u-1",
                    "resourceVersion": "42"}}


class FakeClient:
    def __init__(self) -> None:
        self.created: list[tuple[str, str, dict[str, Any], str | None]] = []
        self.patched: list[tuple[str, Any, str, str | None]] = []
        self.fail_create: Exception | None = None
        self.fail_patch: Exception | None = None

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **_: Any) -> dict[str, Any]:
        if self.fail_create is not None:
            raise self.fail_create
        self.created.append((api_version, plural, body, namespace))
        return body

    async def patch(self, api_version: str, plural: str, name: str, patch: Any,
                    content_type: str = MERGE_PATCH, namespace: str | None = None,
                    **_: Any) -> dict[str, Any]:
        if self.fail_patch is not None:
            raise self.fail_patch
        self.patched.append((name, patch, content_type, namespace))
        return {}


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_event_body_shape() -> None:
    c = FakeClient()
    rec = EventRecorder(c, "node-a")
    await rec.record(POD, "Warning", "FailedMount",
                     'MountVolume.SetUp failed for volume "cfg" : configmap "later" not found',
                     "spec.containers{web}")
    assert len(c.created) == 1
    api_version, plural, body, ns = c.created[0]
    assert (api_version, plural, ns) == ("v1", "events", "ns1")
    assert re.fullmatch(r"web-1\.[0-9a-f]{16}", body["metadata"]["name"])
    assert body["metadata"]["namespace"] == "ns1"
    assert body["apiVersion"] == "v1" and body["kind"] == "Event"
    assert body["involvedObject"] == {"kind": "Pod", "namespace": "ns1", "name": "web-1",
                                      "uid": "u-1", "apiVersion": "v1",
                                      "resourceVersion": "42",
                                      "fieldPath": "spec.containers{web}"}
    assert body["reason"] == "FailedMount" and body["type"] == "Warning"
    assert 'configmap "later" not found' in body["message"]
    assert body["source"] == {"component": "kubelet", "host": "node-a"}
    assert body["reportingComponent"] == "kubelet"
    assert body["reportingInstance"] == "node-a"
    assert body["count"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", body["firstTimestamp"])
    assert body["lastTimestamp"] == body["firstTimestamp"]


async def test_no_field_path_for_pod_level_events() -> None:
    c = FakeClient()
    await EventRecorder(c, "n").record(POD, "Normal", "Scheduled", "x")
    assert "fieldPath" not in c.created[0][2]["involvedObject"]


async def test_dedupe_bumps_count(autojump: trio.testing.MockClock) -> None:
    c = FakeClient()
    rec = EventRecorder(c, "n")
    for _ in range(3):
        await rec.record(POD, "Warning", "BackOff", "Back-off restarting", "spec.containers{a}")
    assert len(c.created) == 1
    name = c.created[0][2]["metadata"]["name"]
    assert [p[1]["count"] for p in c.patched] == [2, 3]
    assert all(p[0] == name and p[2] == MERGE_PATCH and p[3] == "ns1" for p in c.patched)
    assert all("lastTimestamp" in p[1] for p in c.patched)
    # A different message, field path or pod is a different event.
    await rec.record(POD, "Warning", "BackOff", "other", "spec.containers{a}")
    await rec.record(POD, "Warning", "BackOff", "Back-off restarting", "spec.containers{b}")
    other = {"metadata": {**POD["metadata"], "uid": "u-2", "name": "web-2"}}
    await rec.record(other, "Warning", "BackOff", "Back-off restarting", "spec.containers{a}")
    assert len(c.created) == 4
    # After the dedupe window, a new event.
    await trio.sleep(601)
    await rec.record(POD, "Warning", "BackOff", "Back-off restarting", "spec.containers{a}")
    assert len(c.created) == 5


async def test_bump_of_expired_event_creates_a_new_one() -> None:
    c = FakeClient()
    rec = EventRecorder(c, "n")
    await rec.record(POD, "Normal", "Pulled", "m")
    c.fail_patch = ApiException({"reason": "NotFound"}, 404)
    await rec.record(POD, "Normal", "Pulled", "m")
    assert len(c.created) == 2


async def test_rate_limit_per_pod(autojump: trio.testing.MockClock) -> None:
    c = FakeClient()
    rec = EventRecorder(c, "n", burst=25, refill_seconds=5.0, aggregate_after=100)  # rate limit alone
    for i in range(40):
        await rec.record(POD, "Warning", "BackOff", f"m{i}")
    assert len(c.created) == 25
    # Another pod has its own budget.
    other = {"metadata": {**POD["metadata"], "uid": "u-2", "name": "web-2"}}
    await rec.record(other, "Normal", "Started", "s")
    assert len(c.created) == 26
    # One more every refill period.
    await trio.sleep(5)
    await rec.record(POD, "Warning", "BackOff", "late-1")
    await rec.record(POD, "Warning", "BackOff", "late-2")
    assert len(c.created) == 27
    rec.forget("u-1")
    await rec.record(POD, "Warning", "BackOff", "after-forget")
    assert len(c.created) == 28


async def test_errors_are_swallowed() -> None:
    c = FakeClient()
    rec = EventRecorder(c, "n")
    c.fail_create = ApiException({"reason": "Forbidden"}, 403)
    await rec.record(POD, "Normal", "Started", "s")
    c.fail_create = RuntimeError("connection refused")
    await rec.record(POD, "Normal", "Started", "s")
    c.fail_create = None
    await rec.record(POD, "Normal", "Started", "s")
    assert len(c.created) == 1
    c.fail_patch = ApiException({"reason": "InternalError"}, 500)
    await rec.record(POD, "Normal", "Started", "s")  # bump fails: logged, dropped
    await rec.record({}, "Normal", "Started", "s")  # even a malformed pod


async def test_slow_api_is_bounded(autojump: trio.testing.MockClock) -> None:
    class Slow(FakeClient):
        async def create(self, *a: Any, **k: Any) -> dict[str, Any]:
            await trio.sleep_forever()
            raise AssertionError

    rec = EventRecorder(Slow(), "n", timeout=3)
    t0 = trio.current_time()
    await rec.record(POD, "Normal", "Started", "s")
    assert trio.current_time() - t0 == pytest.approx(3)
