"""CronJob controller: create a Job at every scheduled time (kube's cronjob controller v2).

Each sync of a CronJob, in Kubernetes' order:

1. **History.**  Finished Jobs beyond `successfulJobsHistoryLimit` /
   `failedJobsHistoryLimit` are deleted, oldest first (propagation Background).
2. **Bookkeeping.**  `status.active` loses Jobs that finished (event
   SawCompletedJob) or vanished (MissingJob, confirmed with a GET);
   `lastSuccessfulTime` follows the newest completion.
3. **The schedule.**  The most recent scheduled time not yet run is found
   between `lastScheduleTime` (or the creation time) and now — in the CronJob's
   `timeZone` (default: the server's local zone), with robfig/cron's rules
   (`fleet.api.cron`).  Older missed times are skipped, not replayed; more
   than 100 of them is reported (TooManyMissedTimes), as is a time later than
   `startingDeadlineSeconds` allows (MissSchedule, nothing starts).
4. **Concurrency.**  Forbid skips the run while a Job is active (JobAlreadyActive);
   Replace deletes the active Jobs first; Allow just starts another.
5. **The Job** is named `<cronjob>-<scheduled time in minutes since the epoch>`:
   the name is the lock that keeps a restarted or racing controller from
   starting the same run twice (AlreadyExists means it ran).  It is owned by the
   CronJob and annotated with the scheduled time.  `status.active` and
   `lastScheduleTime` are then written, based on the revision read.

The sync ends by asking the work queue to look again just after the next
scheduled time (`queue.add_after`), so nothing polls.  Wall-clock time comes from
an injectable `now` and the local zone is injectable, so tests run the schedule
on Trio's MockClock with a fake wall clock.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import re
import time as _time
import zoneinfo
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.api import meta
from fleet.api.cron import CronError, CronSchedule, parse_cron
from fleet.api.owners import controller_of, controller_ref
from fleet.client import ApiException
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    by_controller_uid,
    key_of,
)

log = logging.getLogger(__name__)

SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
MANY_MISSED = 100
# Wake a little after the scheduled time, so a clock a hair behind still sees it due.
NEXT_SCHEDULE_DELTA = 0.1
JOB_OWNER_INDEX = "controller-uid"
_TZ_PREFIX = re.compile(r"^(?:CRON_TZ|TZ)=(\S+)\s+(.*)$")

Obj = dict[str, Any]
Event = tuple[str, str, str]


# ---------------------------------------------------------------------------------------
# Time


class LocalZone(_dt.tzinfo):
    """The server's local time zone with its daylight-saving rules (the C library's
    view, as Go's time.Local): what a CronJob without `timeZone` runs in."""

    def _offset(self, d: _dt.datetime, *, dst_only: bool = False) -> _dt.timedelta:
        stamp = _time.mktime((d.year, d.month, d.day, d.hour, d.minute, d.second, d.weekday(), 0, -1))
        tm = _time.localtime(stamp)
        if dst_only:
            return _dt.timedelta(hours=1) if tm.tm_isdst > 0 else _dt.timedelta(0)
        return _dt.timedelta(seconds=tm.tm_gmtoff)

    def utcoffset(self, d: _dt.datetime | None) -> _dt.timedelta:
        if d is None:
            return _dt.timedelta(seconds=_time.localtime().tm_gmtoff)
        return self._offset(d)

    def dst(self, d: _dt.datetime | None) -> _dt.timedelta:
        return self._offset(d, dst_only=True) if d is not None else _dt.timedelta(0)

    def tzname(self, d: _dt.datetime | None) -> str:
        return _time.tzname[1 if d is not None and self.dst(d) else 0]

    def fromutc(self, d: _dt.datetime) -> _dt.datetime:
        local = _time.localtime(d.replace(tzinfo=_dt.UTC).timestamp())
        return _dt.datetime(*local[:6], d.microsecond, tzinfo=self)


LOCAL = LocalZone()


def fmt_time(t: _dt.datetime) -> str:
    return t.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


parse_time = meta.parse_time


def rfc3339_in(t: _dt.datetime, tz: _dt.tzinfo) -> str:
    """Go's time.RFC3339 rendering in a zone: "Z" for UTC, else the offset."""
    s = t.astimezone(tz).replace(microsecond=0).isoformat()
    return s[:-6] + "Z" if s.endswith("+00:00") else s


def rfc1123z(t: _dt.datetime) -> str:
    return t.astimezone(_dt.UTC).strftime("%a, %d %b %Y %H:%M:%S +0000")


class ScheduleError(Exception):
    """The schedule or time zone cannot be used; `reason` is the event's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def schedule_of(cj: Obj, local: _dt.tzinfo = LOCAL) -> tuple[CronSchedule, _dt.tzinfo, list[Event]]:
    """The parsed schedule and the zone it runs in (and warnings to report).

    A `TZ=`/`CRON_TZ=` prefix is refused by validation for new schedules but may
    sit in objects stored before; like Kubernetes we warn and honour it."""
    spec = cj.get("spec") or {}
    schedule = str(spec.get("schedule") or "")
    events: list[Event] = []
    tz: _dt.tzinfo = local
    tz_name = spec.get("timeZone")
    if tz_name is not None:
        try:
            if not isinstance(tz_name, str) or tz_name in ("", "Local"):
                raise zoneinfo.ZoneInfoNotFoundError(tz_name)
            tz = zoneinfo.ZoneInfo(tz_name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
            raise ScheduleError("UnknownTimeZone", f"invalid timeZone: {tz_name!r}: {e}") from None
    if "TZ" in schedule:
        events.append(("Warning", "UnsupportedSchedule",
                       f"CRON_TZ or TZ used in schedule {schedule!r} is not officially supported, see "
                       "https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details"))
        m = _TZ_PREFIX.match(schedule.strip())
        if m:
            try:
                tz = zoneinfo.ZoneInfo(m.group(1))
            except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
                raise ScheduleError("UnparseableSchedule",
                                    f"unparseable schedule: {schedule!r} : {e}") from None
            schedule = m.group(2)
    try:
        return parse_cron(schedule), tz, events
    except CronError as e:
        raise ScheduleError("UnparseableSchedule", f"unparseable schedule: {schedule!r} : {e}") from None


@dataclass(frozen=True)
class Missed:
    """Where the schedule stands: the time counted from, the most recent due run
    (None if none is due), and how many runs were due since (0, 1+, or > 100)."""

    earliest: _dt.datetime
    most_recent: _dt.datetime | None
    missed: int


def most_recent_schedule_time(cj: Obj, now: _dt.datetime, sched: CronSchedule, tz: _dt.tzinfo, *,
                              with_deadline: bool) -> Missed:
    """The newest scheduled time in (lastScheduleTime or creation, now].

    Counting every missed run of a wedged controller (a minutely schedule over a
    lost weekend) would cost thousands of steps, so, as Kubernetes, the number
    missed is estimated from the gap between two runs and the search starts just
    before the estimated last one."""
    md, st = cj.get("metadata") or {}, cj.get("status") or {}
    earliest = parse_time(st.get("lastScheduleTime")) or parse_time(md.get("creationTimestamp")) or now
    deadline = (cj.get("spec") or {}).get("startingDeadlineSeconds")
    if with_deadline and isinstance(deadline, int):
        earliest = max(earliest, now - _dt.timedelta(seconds=deadline))
    t1 = sched.next_after(earliest, tz)
    if t1 is None or now < t1:
        return Missed(earliest, None, 0)
    t2 = sched.next_after(t1, tz)
    if t2 is None or now < t2:
        return Missed(earliest, t1, 1)
    interval = round((t2 - t1).total_seconds())
    if interval < 1:
        raise ScheduleError("InvalidSchedule", "time difference between two schedules is less than 1 second")
    missed = int((now - t1).total_seconds()) // interval + 1
    start = t1 + _dt.timedelta(seconds=(missed - 2) * interval)
    most_recent: _dt.datetime | None = None
    t = sched.next_after(start, tz)
    while t is not None and t <= now:
        most_recent = t
        t = sched.next_after(t, tz)
    return Missed(earliest, most_recent, missed)


def next_schedule_delay(cj: Obj, now: _dt.datetime, sched: CronSchedule, tz: _dt.tzinfo) -> float | None:
    """Seconds until just after the next run is due (None: the schedule never fires)."""
    try:
        m = most_recent_schedule_time(cj, now, sched, tz, with_deadline=False)
        base = m.most_recent or (m.earliest if m.missed == 0 else now)
    except ScheduleError:
        base = now
    nxt = sched.next_after(base, tz)
    if nxt is None:
        return None
    return (nxt - now).total_seconds() + NEXT_SCHEDULE_DELTA


def job_name(cj: Obj, scheduled: _dt.datetime) -> str:
    """`<cronjob>-<minutes since the epoch>`: one name per scheduled run."""
    return f"{(cj.get('metadata') or {}).get('name')}-{int(scheduled.timestamp()) // 60}"


def build_job(cj: Obj, scheduled: _dt.datetime, tz: _dt.tzinfo) -> Obj:
    """The Job for one run: the template's labels, annotations and spec, owned by the CronJob."""
    md = cj.get("metadata") or {}
    template = (cj.get("spec") or {}).get("jobTemplate") or {}
    tmeta = template.get("metadata") or {}
    annotations = dict(tmeta.get("annotations") or {})
    annotations[SCHEDULED_TIMESTAMP] = rfc3339_in(scheduled, tz)
    job_md: Obj = {"name": job_name(cj, scheduled), "namespace": md.get("namespace"),
                   "annotations": annotations,
                   "ownerReferences": [controller_ref(cj, api_version="batch/v1", kind="CronJob")]}
    if tmeta.get("labels"):
        job_md["labels"] = dict(tmeta["labels"])
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_md,
            "spec": copy.deepcopy(template.get("spec") or {})}


def finished_type(job: Obj) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def _start_key(job: Obj) -> tuple[int, float, str]:
    start = parse_time((job.get("status") or {}).get("startTime"))
    name = str((job.get("metadata") or {}).get("name") or "")
    return (0, start.timestamp(), name) if start else (1, 0.0, name)


def history_to_delete(cj: Obj, jobs: Sequence[Obj]) -> list[Obj]:
    """Finished Jobs beyond the history limits, oldest (by start time) first."""
    spec = cj.get("spec") or {}
    out: list[Obj] = []
    for ctype, key in (("Complete", "successfulJobsHistoryLimit"), ("Failed", "failedJobsHistoryLimit")):
        limit = spec.get(key)
        if not isinstance(limit, int):
            continue
        done = sorted((j for j in jobs if finished_type(j) == ctype), key=_start_key)
        if len(done) > limit:
            out.extend(done[:len(done) - limit])
    return out


def _status_of(cj: Obj) -> Obj:
    """cj["status"], created when missing or null (a status can be stored as null)."""
    st = cj.get("status")
    if not isinstance(st, dict):
        st = cj["status"] = {}
    return st


def job_ref(job: Obj) -> Obj:
    md = job.get("metadata") or {}
    return {"apiVersion": "batch/v1", "kind": "Job", "name": md.get("name"), "namespace": md.get("namespace"),
            "uid": md.get("uid"), "resourceVersion": md.get("resourceVersion")}


@dataclass
class RunDecision:
    """What to do about the schedule in this sync."""

    scheduled: _dt.datetime | None = None  # a run to start now
    replace: bool = False  # delete the active Jobs first
    requeue_after: float | None = None
    events: list[Event] = field(default_factory=list)


def decide_run(cj: Obj, now: _dt.datetime, sched: CronSchedule, tz: _dt.tzinfo) -> RunDecision:
    """Whether a run is due now (the status' active list already brought up to date)."""
    spec, st = cj.get("spec") or {}, cj.get("status") or {}
    d = RunDecision(requeue_after=next_schedule_delay(cj, now, sched, tz))
    try:
        m = most_recent_schedule_time(cj, now, sched, tz, with_deadline=True)
    except ScheduleError as e:
        d.events.append(("Warning", e.reason, f"invalid schedule: {spec.get('schedule')} : {e}"))
        return d
    scheduled = m.most_recent
    if scheduled is None:
        return d
    if m.missed > MANY_MISSED:
        d.events.append(("Warning", "TooManyMissedTimes", "too many missed start times. Set or decrease "
                         ".spec.startingDeadlineSeconds or check clock skew"))
    deadline = spec.get("startingDeadlineSeconds")
    if isinstance(deadline, int) and scheduled + _dt.timedelta(seconds=deadline) < now:
        d.events.append(("Warning", "MissSchedule",
                         f"Missed scheduled time to start a job: {rfc1123z(scheduled)}"))
        return d
    name = job_name(cj, scheduled)
    active = [a for a in st.get("active") or [] if isinstance(a, dict)]
    if any(a.get("name") == name for a in active) or parse_time(st.get("lastScheduleTime")) == scheduled:
        return d  # this run was started already
    policy = spec.get("concurrencyPolicy") or "Allow"
    if policy == "Forbid" and active:
        d.events.append(("Normal", "JobAlreadyActive", "Not starting job because prior execution is running "
                         "and concurrency policy is Forbid"))
        return d
    d.scheduled = scheduled
    d.replace = policy == "Replace" and bool(active)
    return d


# ---------------------------------------------------------------------------------------
# The controller


class CronJobController(QueueWorker):
    name = "cronjob"
    workers = 2

    def __init__(self, *, now: Callable[[], _dt.datetime] = meta.utcnow,
                 local_zone: _dt.tzinfo = LOCAL) -> None:
        super().__init__()
        self.now = now
        self.local_zone = local_zone

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cronjobs: SharedInformer = ctx.informers.informer("batch/v1", "cronjobs")
        self.jobs: SharedInformer = ctx.informers.informer("batch/v1", "jobs")
        self.jobs.add_index(JOB_OWNER_INDEX, by_controller_uid)
        self.cronjobs.add_handler(self._on_cronjob)
        self.jobs.add_handler(self._on_job)

    def _record(self, obj: Obj, events: Sequence[Event]) -> None:
        if self.ctx.events is None:
            return
        for type_, reason, message in events:
            self.ctx.events.record(obj, type_, reason, message)

    def _on_cronjob(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        key = key_of(new)
        if etype == "MODIFIED" and old is not None:
            o, n = old.get("spec") or {}, new.get("spec") or {}
            if (o.get("schedule"), o.get("timeZone")) != (n.get("schedule"), n.get("timeZone")):
                # Look when the new schedule is next due (sooner than before, maybe).
                try:
                    sched, tz, _ = schedule_of(new, self.local_zone)
                except ScheduleError:
                    self.queue.add(key)  # the sync reports it
                    return
                delay = next_schedule_delay(new, self.now(), sched, tz)
                if delay is not None:
                    self.queue.add_after(key, delay)
                return
        self.queue.add(key)

    def _on_job(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        for job in (old, new):
            if job is None:
                continue
            ref = controller_of(job)
            if not ref or ref.get("kind") != "CronJob":
                continue
            ns = (job.get("metadata") or {}).get("namespace") or ""
            cj = self.cronjobs.get(f"{ns}/{ref.get('name')}")
            if cj is not None and (cj.get("metadata") or {}).get("uid") == ref.get("uid"):
                self.queue.add(key_of(cj))

    async def reconcile(self, key: str) -> float | None:
        try:
            return await self._sync(key)
        except ApiException as e:
            if e.code != 409 or e.reason == "AlreadyExists":
                raise
            # A stale copy of the CronJob: the newer version's watch event brings it
            # back; a quiet look a second later covers the rest.
            log.debug("cronjob %s: %s", key, e)
            return 1.0

    async def _sync(self, key: str) -> float | None:
        cached = self.cronjobs.get(key)
        if cached is None:
            return None
        cj = copy.deepcopy(cached)
        uid = (cj.get("metadata") or {}).get("uid")
        jobs = [j for j in self.jobs.by_index(JOB_OWNER_INDEX, str(uid))]
        changed = await self._clean_history(cj, jobs)
        now = self.now()
        changed |= await self._sync_active(cj, jobs)
        requeue: float | None = None
        if not (cj.get("metadata") or {}).get("deletionTimestamp"):
            requeue, started = await self._schedule(cj, now)
            changed |= started
        if changed:
            md = cj["metadata"]
            # The revision we read: a concurrent writer makes this 409 and we sync again.
            await self.ctx.client.replace("batch/v1", "cronjobs", md["name"], cj, md.get("namespace"),
                                          subresource="status")
        return requeue

    async def _delete_job(self, cj: Obj, job: Obj) -> bool:
        md = job.get("metadata") or {}
        try:
            await self.ctx.client.delete("batch/v1", "jobs", md["name"], md.get("namespace"),
                                         body={"apiVersion": "v1", "kind": "DeleteOptions",
                                               "propagationPolicy": "Background"})
        except ApiException as e:
            if e.code != 404:
                self._record(cj, [("Warning", "FailedDelete", f"Deleted job: {e}")])
                return False
        st = _status_of(cj)
        st["active"] = [a for a in st.get("active") or [] if a.get("uid") != md.get("uid")]
        self._record(cj, [("Normal", "SuccessfulDelete", f"Deleted job {md.get('name')}")])
        return True

    async def _clean_history(self, cj: Obj, jobs: list[Obj]) -> bool:
        changed = False
        for job in history_to_delete(cj, jobs):
            if await self._delete_job(cj, job):
                changed = True
                jobs.remove(job)
        return changed

    async def _sync_active(self, cj: Obj, jobs: list[Obj]) -> bool:
        """Bring status.active and lastSuccessfulTime up to date with the Jobs."""
        st = _status_of(cj)
        changed = False
        md = cj.get("metadata") or {}
        for job in jobs:
            jmd = job.get("metadata") or {}
            active_uids = {a.get("uid") for a in st.get("active") or []}
            done = finished_type(job)
            if jmd.get("uid") not in active_uids and done is None:
                # Our own status write may not have reached the cache yet: ask.
                try:
                    fresh = await self.ctx.client.get_object("batch/v1", "cronjobs", md["name"], md.get("namespace"))
                except ApiException as e:
                    if e.code == 404:
                        return changed
                    raise
                if any(a.get("uid") == jmd.get("uid") for a in (fresh.get("status") or {}).get("active") or []):
                    cj.clear()
                    cj.update(fresh)
                    st = _status_of(cj)
                    continue
                self._record(cj, [("Warning", "UnexpectedJob",
                                   f"Saw a job that the controller did not create or forgot: {jmd.get('name')}")])
            elif jmd.get("uid") in active_uids and done is not None:
                st["active"] = [a for a in st.get("active") or [] if a.get("uid") != jmd.get("uid")]
                self._record(cj, [("Normal", "SawCompletedJob",
                                   f"Saw completed job: {jmd.get('name')}, status: {done}")])
                changed = True
            if done == "Complete":
                completed = parse_time((job.get("status") or {}).get("completionTime"))
                last = parse_time(st.get("lastSuccessfulTime"))
                if completed is not None and (last is None or completed > last):
                    st["lastSuccessfulTime"] = fmt_time(completed)
                    changed = True
        present = {(j.get("metadata") or {}).get("uid") for j in jobs}
        for ref in list(st.get("active") or []):
            if ref.get("uid") in present:
                continue
            try:
                await self.ctx.client.get_object("batch/v1", "jobs", str(ref.get("name")),
                                                 ref.get("namespace") or md.get("namespace"))
            except ApiException as e:
                if e.code != 404:
                    raise
                self._record(cj, [("Normal", "MissingJob", f"Active job went missing: {ref.get('name')}")])
                st["active"] = [a for a in st.get("active") or [] if a.get("uid") != ref.get("uid")]
                changed = True
        return changed

    async def _schedule(self, cj: Obj, now: _dt.datetime) -> tuple[float | None, bool]:
        """Start the run that is due, if any; returns (next look, status changed)."""
        spec = cj.get("spec") or {}
        try:
            sched, tz, warnings = schedule_of(cj, self.local_zone)
        except ScheduleError as e:
            # Kubernetes' order: a bad zone is reported even while suspended.
            if e.reason == "UnknownTimeZone" or spec.get("suspend") is not True:
                self._record(cj, [("Warning", e.reason, str(e))])
            return None, False
        if spec.get("suspend") is True:
            return None, False
        self._record(cj, warnings)
        d = decide_run(cj, now, sched, tz)
        self._record(cj, d.events)
        if d.scheduled is None:
            return d.requeue_after, False
        changed = False
        st = _status_of(cj)
        if d.replace:
            for ref in list(st.get("active") or []):
                try:
                    job = await self.ctx.client.get_object("batch/v1", "jobs", str(ref.get("name")),
                                                           ref.get("namespace"))
                except ApiException as e:
                    if e.code != 404:
                        self._record(cj, [("Warning", "FailedGet", f"Get job: {e}")])
                        raise
                    st["active"] = [a for a in st.get("active") or [] if a.get("uid") != ref.get("uid")]
                    changed = True
                    continue
                if not await self._delete_job(cj, job):
                    raise RuntimeError(f"could not replace job {ref.get('name')}")
                changed = True
        body = build_job(cj, d.scheduled, tz)
        md = cj.get("metadata") or {}
        try:
            job = await self.ctx.client.create("batch/v1", "jobs", body, md.get("namespace"))
        except ApiException as e:
            if e.code != 409:
                if not (e.code in (403, 404) and "terminat" in str(e).lower()):
                    self._record(cj, [("Warning", "FailedCreate", f"Error creating job: {e}")])
                raise
            # The name is the lock: this run exists.  Ours but not in the list (we
            # crashed before writing the status)?  Then record it now.
            job = await self.ctx.client.get_object("batch/v1", "jobs", body["metadata"]["name"],
                                                   md.get("namespace"))
            ref = controller_of(job)
            if not ref or ref.get("uid") != md.get("uid"):
                return d.requeue_after, changed
            if any(a.get("uid") == (job.get("metadata") or {}).get("uid") for a in st.get("active") or []):
                return d.requeue_after, changed
        else:
            self._record(cj, [("Normal", "SuccessfulCreate", f"Created job {body['metadata']['name']}")])
        st.setdefault("active", []).append(job_ref(job))
        st["lastScheduleTime"] = fmt_time(d.scheduled)
        return d.requeue_after, True
