"""The CronJob controller: schedule arithmetic (tables) and the loop under MockClock.

The loop tests run `CronJobController` against `FakeCluster` with the fake wall
clock (2025-03-01 12:00:00 UTC plus Trio's clock): one simulated minute is one
MockClock minute, so a schedule is followed for hours in milliseconds.  Jobs are
finished by the test (no Job controller runs here).
"""

from __future__ import annotations

import datetime as dt
import time
import zoneinfo
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from fleet.api.cron import parse_cron
from fleet.controllers.cronjob import (
    LOCAL,
    SCHEDULED_TIMESTAMP,
    CronJobController,
    ScheduleError,
    build_job,
    decide_run,
    history_to_delete,
    job_name,
    most_recent_schedule_time,
    next_schedule_delay,
    schedule_of,
)

from .batch_fake import EPOCH, FakeCluster, ts, wall

UTC = dt.UTC
T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def cronjob(schedule: str = "*/1 * * * *", *, created: dt.datetime = T0, last: dt.datetime | None = None,
            active: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"schedule": schedule, "timeZone": "UTC", "concurrencyPolicy": "Allow",
                         "suspend": False, "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
                         "jobTemplate": {"spec": {"template": {"spec": {
                             "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}
    s.update(spec)
    status: dict[str, Any] = {}
    if last is not None:
        status["lastScheduleTime"] = ts(last)
    if active:
        status["active"] = [{"name": n, "uid": f"uid-{n}", "namespace": "default"} for n in active]
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "tick", "namespace": "default", "uid": "cj-uid", "creationTimestamp": ts(created)},
            "spec": s, "status": status}


def at(minutes: float = 0, seconds: float = 0) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes, seconds=seconds)


# ---------------------------------------------------------------------------------------
# Pure parts


def test_job_name_is_minutes_since_the_epoch():
    assert job_name(cronjob(), T0) == f"tick-{int(T0.timestamp()) // 60}" == "tick-29013840"


@pytest.mark.parametrize(("desc", "cj", "now", "most_recent", "missed"), [
    ("just created, not due", cronjob(), at(0, 30), None, 0),
    ("first minute due", cronjob(), at(1, 5), at(1), 1),
    ("after the last run, not due yet", cronjob(last=at(1)), at(1, 40), None, 0),
    ("three missed: only the latest", cronjob(last=at(1)), at(4, 10), at(4), 3),
    ("hourly, a day down", cronjob("@hourly", created=at(0)), at(24 * 60 + 5), at(24 * 60), 24),
    ("two hundred minutes missed", cronjob(), at(200, 1), at(200), 200),
])
def test_most_recent_schedule_time(desc, cj, now, most_recent, missed):
    sched, tz, _ = schedule_of(cj)
    m = most_recent_schedule_time(cj, now, sched, tz, with_deadline=True)
    assert (m.most_recent, m.missed) == (most_recent, missed), desc


def test_starting_deadline_narrows_the_window():
    cj = cronjob("@hourly", created=at(0), startingDeadlineSeconds=120)
    sched, tz, _ = schedule_of(cj)
    # 70 minutes later: the 13:00 run is 10 minutes old, older than the deadline allows.
    m = most_recent_schedule_time(cj, at(70), sched, tz, with_deadline=True)
    assert m.most_recent is None
    d = decide_run(cj, at(61), sched, tz)
    assert d.scheduled == at(60)


@pytest.mark.parametrize(("desc", "cj", "now", "runs", "replace", "reasons"), [
    ("due: run", cronjob(), at(1, 1), at(1), False, []),
    ("already started this minute", cronjob(last=at(1)), at(1, 30), None, False, []),
    ("already in the active list by name", cronjob(active=["tick-29013841"]), at(1, 1), None, False, []),
    ("Forbid with one active: skip", cronjob(last=at(0), active=["old"], concurrencyPolicy="Forbid"),
     at(1, 1), None, False, ["JobAlreadyActive"]),
    ("Replace with one active: replace", cronjob(last=at(0), active=["old"], concurrencyPolicy="Replace"),
     at(1, 1), at(1), True, []),
    ("Allow with one active: run beside it", cronjob(last=at(0), active=["old"]), at(1, 1), at(1), False, []),
    ("too late for the starting deadline", cronjob(last=at(0), startingDeadlineSeconds=5),
     at(1, 30), None, False, []),
    ("way too many missed", cronjob(), at(500, 10), at(500), False, ["TooManyMissedTimes"]),
])
def test_decide_run(desc, cj, now, runs, replace, reasons):
    sched, tz, _ = schedule_of(cj)
    d = decide_run(cj, now, sched, tz)
    assert (d.scheduled, d.replace, [r for _, r, _ in d.events]) == (runs, replace, reasons), desc


def test_missed_deadline_event_when_the_only_due_run_is_too_old():
    cj = cronjob("0 * * * *", created=at(-120), startingDeadlineSeconds=60)
    sched, tz, _ = schedule_of(cj)
    # The deadline limits the search window too, so an old run is simply not found...
    assert decide_run(cj, at(30), sched, tz).scheduled is None
    # ... and one inside the window but past its own deadline is reported.
    cj = cronjob("0 * * * *", created=at(-120), startingDeadlineSeconds=600)
    d = decide_run(cj, at(9, 59), sched, tz)
    assert d.scheduled == at(0)


def test_next_schedule_delay():
    cj = cronjob(last=at(1))
    sched, tz, _ = schedule_of(cj)
    assert next_schedule_delay(cj, at(1, 20), sched, tz) == pytest.approx(40.1)
    hourly = cronjob("@hourly", last=at(0))
    sched, tz, _ = schedule_of(hourly)
    assert next_schedule_delay(hourly, at(10), sched, tz) == pytest.approx(50 * 60 + 0.1)


@pytest.mark.parametrize(("schedule", "tz", "now", "due"), [
    # 09:00 in New York is 14:00 UTC in winter, 13:00 UTC in summer.
    ("0 9 * * *", "America/New_York", dt.datetime(2025, 1, 15, 14, 1, tzinfo=UTC),
     dt.datetime(2025, 1, 15, 14, 0, tzinfo=UTC)),
    ("0 9 * * *", "America/New_York", dt.datetime(2025, 7, 15, 13, 1, tzinfo=UTC),
     dt.datetime(2025, 7, 15, 13, 0, tzinfo=UTC)),
    ("30 1 * * *", "Asia/Kolkata", dt.datetime(2025, 7, 14, 20, 1, tzinfo=UTC),
     dt.datetime(2025, 7, 14, 20, 0, tzinfo=UTC)),
])
def test_time_zones(schedule, tz, now, due):
    cj = cronjob(schedule, created=now - dt.timedelta(hours=2), timeZone=tz)
    sched, zone, _ = schedule_of(cj)
    assert decide_run(cj, now, sched, zone).scheduled == due
    job = build_job(cj, due, zone)
    assert job["metadata"]["annotations"][SCHEDULED_TIMESTAMP] == due.astimezone(zoneinfo.ZoneInfo(tz)).isoformat()


@pytest.mark.parametrize(("macro", "fires"), [
    ("@hourly", at(60)), ("@daily", dt.datetime(2025, 3, 2, tzinfo=UTC)),
    ("@midnight", dt.datetime(2025, 3, 2, tzinfo=UTC)), ("@weekly", dt.datetime(2025, 3, 2, tzinfo=UTC)),
    ("@monthly", dt.datetime(2025, 4, 1, tzinfo=UTC)), ("@yearly", dt.datetime(2026, 1, 1, tzinfo=UTC)),
    ("@annually", dt.datetime(2026, 1, 1, tzinfo=UTC)),
])
def test_macros(macro, fires):
    assert parse_cron(macro).next_after(T0, UTC) == fires


def test_day_fields_combine_like_cron():
    # Both restricted: either matches (the 13th, or a Friday).  March 2025: Fri 7th, Thu 13th.
    either = parse_cron("0 0 13 * 5")
    assert either.next_after(T0, UTC) == dt.datetime(2025, 3, 7, tzinfo=UTC)
    # Day of week "*": only the day of month counts; "*/2" is not a star for this rule.
    assert parse_cron("0 0 13 * *").next_after(T0, UTC) == dt.datetime(2025, 3, 13, tzinfo=UTC)
    assert parse_cron("0 0 13 * */2").next_after(T0, UTC) == dt.datetime(2025, 3, 2, tzinfo=UTC)


def test_schedule_errors_and_tz_prefix():
    with pytest.raises(ScheduleError) as e:
        schedule_of(cronjob(timeZone="Mars/Olympus"))
    assert e.value.reason == "UnknownTimeZone"
    with pytest.raises(ScheduleError) as e:
        schedule_of(cronjob("61 * * * *"))
    assert e.value.reason == "UnparseableSchedule"
    sched, tz, warnings = schedule_of(cronjob("CRON_TZ=Europe/Paris 0 6 * * *", timeZone=None))
    assert str(tz) == "Europe/Paris" and [r for _, r, _ in warnings] == ["UnsupportedSchedule"]
    _, local, _ = schedule_of(cronjob(timeZone=None))
    assert local is LOCAL


def test_local_zone_agrees_with_the_c_library():
    now = dt.datetime.now(UTC).replace(microsecond=0)
    local = now.astimezone(LOCAL)
    assert local.utcoffset() == dt.timedelta(seconds=time.localtime(now.timestamp()).tm_gmtoff)
    assert local.replace(tzinfo=None) == dt.datetime(*time.localtime(now.timestamp())[:6])


def finished_job(name: str, ctype: str, start: dt.datetime) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "status": {"startTime": ts(start), "conditions": [{"type": ctype, "status": "True"}]}}


def test_history_limits_delete_the_oldest():
    jobs = [finished_job(f"ok{i}", "Complete", at(i)) for i in range(5)] + \
        [finished_job(f"bad{i}", "Failed", at(i)) for i in range(3)] + \
        [{"metadata": {"name": "running"}, "status": {}}]
    names = [j["metadata"]["name"] for j in history_to_delete(cronjob(), jobs)]
    assert names == ["ok0", "ok1", "bad0", "bad1"]
    assert history_to_delete(cronjob(successfulJobsHistoryLimit=0, failedJobsHistoryLimit=None), jobs[:2]) \
        == jobs[:2]


def test_build_job():
    cj = cronjob()
    cj["spec"]["jobTemplate"]["metadata"] = {"labels": {"team": "a"}, "annotations": {"note": "x"}}
    job = build_job(cj, at(1), UTC)
    md = job["metadata"]
    assert md["name"] == "tick-29013841" and md["labels"] == {"team": "a"}
    assert md["annotations"] == {"note": "x", SCHEDULED_TIMESTAMP: "2025-03-01T12:01:00Z"}
    assert md["ownerReferences"][0] == {"apiVersion": "batch/v1", "kind": "CronJob", "name": "tick",
                                        "uid": "cj-uid", "controller": True, "blockOwnerDeletion": True}
    assert job["spec"] == cj["spec"]["jobTemplate"]["spec"]


# ---------------------------------------------------------------------------------------
# The controller under MockClock


def new_cronjob(name: str = "tick", schedule: str = "*/1 * * * *", **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"schedule": schedule, "timeZone": "UTC", "jobTemplate": {"spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}
    s.update(spec)
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": "default"},
            "spec": s}


@asynccontextmanager
async def controller(fake: FakeCluster) -> AsyncIterator[CronJobController]:
    c = CronJobController(now=wall, local_zone=UTC)
    c.setup(fake.ctx)
    fake.start()
    async with trio.open_nursery() as n:
        n.start_soon(c.run, fake.ctx)
        yield c
        n.cancel_scope.cancel()


def jobs(fake: FakeCluster) -> list[dict[str, Any]]:
    return fake.list("batch/v1", "jobs", "default")


def finish(fake: FakeCluster, name: str, ctype: str = "Complete") -> None:
    j = fake.get("batch/v1", "jobs", "default", name)
    assert j is not None
    now = ts(wall())
    status: dict[str, Any] = {"startTime": j.get("status", {}).get("startTime") or now,
                              "conditions": [{"type": ctype, "status": "True", "lastTransitionTime": now}]}
    if ctype == "Complete":
        status["completionTime"] = now
        status["succeeded"] = 1
    j["status"] = status
    fake._update("batch/v1", "jobs", fake.get("batch/v1", "jobs", "default", name), j)


async def until(what: str, pred: Callable[[], Any], timeout: float = 3600, step: float = 0.5) -> Any:
    with trio.move_on_after(timeout):
        while True:
            got = pred()
            if got:
                return got
            await trio.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def minute_of(t: float) -> int:
    return int((EPOCH + dt.timedelta(seconds=t)).timestamp()) // 60


async def test_fires_every_minute_on_the_minute(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob())
    created: dict[str, float] = {}
    async with controller(fake):
        while len(created) < 3:
            for j in jobs(fake):
                name = j["metadata"]["name"]
                if name not in created:
                    created[name] = trio.current_time()
                    finish(fake, name)
            await trio.sleep(0.05)
            assert trio.current_time() < 600
        await trio.sleep(1)
        cj = fake.get("batch/v1", "cronjobs", "default", "tick")
    # Named by their minute, created within a second of it (EPOCH is on a minute).
    for name, when in created.items():
        assert name == f"tick-{minute_of(when)}"
        assert 0 <= when % 60 < 1.0, created
    assert cj["status"]["lastScheduleTime"] == ts(EPOCH + dt.timedelta(minutes=3))
    assert cj["status"].get("active", []) == []
    assert cj["status"]["lastSuccessfulTime"]
    reasons = fake.events.reasons("tick")
    assert reasons.count("SuccessfulCreate") >= 3 and "SawCompletedJob" in reasons


async def test_allow_runs_side_by_side(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob(concurrencyPolicy="Allow"))
    async with controller(fake):
        await until("three running jobs", lambda: len(jobs(fake)) == 3)
        cj = fake.get("batch/v1", "cronjobs", "default", "tick")
        await until("the status to list three", lambda: len(
            fake.get("batch/v1", "cronjobs", "default", "tick")["status"].get("active", [])) == 3)
    assert cj is not None


async def test_forbid_skips_while_a_job_runs(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob(concurrencyPolicy="Forbid"))
    async with controller(fake):
        first = (await until("a job", lambda: jobs(fake)))[0]["metadata"]["name"]
        await trio.sleep(150)  # two more scheduled times pass while it runs
        assert [j["metadata"]["name"] for j in jobs(fake)] == [first]
        assert "JobAlreadyActive" in fake.events.reasons("tick")
        finish(fake, first)
        await until("the next run", lambda: len(jobs(fake)) == 2)


async def test_replace_deletes_the_running_job(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob(concurrencyPolicy="Replace"))
    async with controller(fake):
        first = (await until("a job", lambda: jobs(fake)))[0]["metadata"]["name"]
        second = await until("a replacement", lambda: [j for j in jobs(fake) if j["metadata"]["name"] != first])
        assert [j["metadata"]["name"] for j in jobs(fake)] == [second[0]["metadata"]["name"]]
        assert fake.last_delete_options["propagationPolicy"] == "Background"
        cj = fake.get("batch/v1", "cronjobs", "default", "tick")
        await until("active to be the new job", lambda: [a["name"] for a in fake.get(
            "batch/v1", "cronjobs", "default", "tick")["status"]["active"]] == [second[0]["metadata"]["name"]])
    assert "SuccessfulDelete" in fake.events.reasons("tick") and cj is not None


async def test_missed_runs_start_only_the_latest(autojump_clock):
    """A CronJob created three hours 'ago' (the controller was down): one Job, for the last hour."""
    fake = FakeCluster()
    cj = new_cronjob(schedule="@hourly")
    cj["metadata"]["creationTimestamp"] = ts(EPOCH - dt.timedelta(hours=3, minutes=10))
    fake.add("batch/v1", "cronjobs", cj)
    async with controller(fake):
        await until("a job", lambda: jobs(fake))
        await trio.sleep(30)
        assert [j["metadata"]["name"] for j in jobs(fake)] == [f"tick-{int(EPOCH.timestamp()) // 60}"]
        # And the next one at 13:00.
        second = await until("the 13:00 run", lambda: len(jobs(fake)) == 2 and jobs(fake)[1], step=30)
        assert fake.created_at[second["metadata"]["name"]] == pytest.approx(3600, abs=1)


async def test_starting_deadline_misses_a_late_run(autojump_clock):
    fake = FakeCluster()
    cj = new_cronjob(schedule="@hourly", startingDeadlineSeconds=10)
    # Last run at 11:00; the 12:00 run was due 30 s before the controller (re)started.
    cj["metadata"]["creationTimestamp"] = ts(EPOCH - dt.timedelta(hours=2))
    fake.add("batch/v1", "cronjobs", cj)
    stored = fake.get("batch/v1", "cronjobs", "default", "tick")
    stored["status"] = {"lastScheduleTime": ts(EPOCH - dt.timedelta(hours=1))}
    fake._update("batch/v1", "cronjobs", fake.get("batch/v1", "cronjobs", "default", "tick"), stored)
    await trio.sleep(30)
    async with controller(fake):
        await trio.sleep(60)
        assert jobs(fake) == []  # 12:00 is outside the 10 s window: skipped
        await until("the 13:00 run", lambda: jobs(fake))


async def test_suspended_cronjob_starts_nothing(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob(suspend=True))
    async with controller(fake):
        await trio.sleep(300)
        assert jobs(fake) == []
        cj = fake.get("batch/v1", "cronjobs", "default", "tick")
        cj["spec"]["suspend"] = False
        fake.update("batch/v1", "cronjobs", cj)
        await until("a run after resuming", lambda: jobs(fake))
    # Resuming does not replay the five missed minutes: one Job, for the latest.
    assert len(jobs(fake)) == 1


async def test_history_limits_through_the_loop(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob(successfulJobsHistoryLimit=2, failedJobsHistoryLimit=1))
    seen: set[str] = set()
    async with controller(fake):
        while len(seen) < 6:
            for j in jobs(fake):
                name = j["metadata"]["name"]
                if name not in seen:
                    seen.add(name)
                    finish(fake, name, "Failed" if len(seen) % 2 else "Complete")
            await trio.sleep(0.5)
            assert trio.current_time() < 900
        await trio.sleep(61)
    finished = [(j["metadata"]["name"], j["status"]["conditions"][0]["type"]) for j in jobs(fake)
                if j.get("status", {}).get("conditions")]
    assert sum(1 for _, t in finished if t == "Complete") == 2
    assert sum(1 for _, t in finished if t == "Failed") == 1


async def test_time_zone_schedule_through_the_loop(autojump_clock):
    """09:00 in Tokyo is 00:00 UTC: the job appears at 00:00 UTC the next day (12 h on)."""
    fake = FakeCluster()
    fake.add("batch/v1", "cronjobs", new_cronjob(schedule="0 9 * * *", timeZone="Asia/Tokyo"))
    async with controller(fake):
        job = (await until("the 09:00 Tokyo run", lambda: jobs(fake), timeout=13 * 3600, step=300))[0]
    assert fake.created_at[job["metadata"]["name"]] == pytest.approx(12 * 3600, abs=1)
    assert job["metadata"]["annotations"][SCHEDULED_TIMESTAMP] == "2025-03-02T09:00:00+09:00"
