"""The Job controller's decisions for one sync, as pure functions over what the
controller observed: `assess` (what to create and delete, whether the Job
ends), `track` (what to count, which finalizers to remove) and `settle`
(moving counted pods into the counters and finishing), plus the Events and
TTL of a finished Job.  The controller loop in `job.py` does the I/O between
them; the rules they apply are `job_rules.py`.
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.api.conditions import get_condition
from fleet.controllers.job_rules import (
    COMPLETE,
    FAILED,
    FAILURE_TARGET,
    INDEX_FAILURE_COUNT,
    INDEX_IGNORED_FAILURE_COUNT,
    MAX_POD_CREATE_DELETE_PER_SYNC,
    MAX_UNCOUNTED_PODS,
    MSG_BACKOFF_LIMIT,
    MSG_COMPLETIONS_REACHED,
    MSG_DEADLINE,
    MSG_FAILED_INDEXES,
    MSG_MAX_FAILED_INDEXES,
    REASON_BACKOFF_LIMIT,
    REASON_COMPLETIONS_REACHED,
    REASON_DEADLINE,
    REASON_FAILED_INDEXES,
    REASON_MAX_FAILED_INDEXES,
    REASON_POD_FAILURE_POLICY,
    SUCCESS_CRITERIA_MET,
    SUSPENDED,
    SYNC_BATCH_PERIOD,
    Backoff,
    Event,
    Obj,
    _annotation_count,
    _int,
    _md,
    _uid,
    completion_index,
    ensure_condition,
    failure_counts,
    finish_time,
    finished_at,
    first_pending_indexes,
    fmt_time,
    format_indexes,
    has_tracking_finalizer,
    is_active,
    is_indexed,
    is_ready,
    is_terminating,
    match_pod_failure_policy,
    new_condition,
    parse_indexes,
    parse_time,
    past_backoff_limit_on_failure,
    phase,
    pod_failed,
    pods_for_removal,
    remaining_backoff,
    replaces_only_failed,
)

# ---------------------------------------------------------------------------------------
# The plan: assess → (create/delete) → track → (write, remove finalizers) → settle


@dataclass
class Observed:
    """Everything `assess` decides from."""

    job: Obj
    pods: list[Obj]
    now: _dt.datetime
    backoff: Backoff = field(default_factory=Backoff)
    removing: frozenset[str] = frozenset()  # uids whose finalizer removal is in flight
    satisfied: bool = True  # no pod creation/deletion of ours still unseen


@dataclass
class Assessment:
    obs: Observed
    status: Obj  # the stored status plus startTime
    tracked: list[Obj]  # pods still holding our finalizer (removal not in flight)
    active: list[Obj]
    ready: int
    terminating: int
    succeeded: int
    failed: int
    uncounted_succeeded: set[str]
    uncounted_failed: set[str]
    succeeded_indexes: set[int]
    prev_succeeded_indexes: set[int]
    failed_indexes: set[int] | None  # None unless backoffLimitPerIndex
    delayed: dict[int, Obj]  # per index: the failed pod kept until its replacement exists
    finished: Obj | None  # interim condition decided (FailureTarget / SuccessCriteriaMet)
    backoff: Backoff
    delete: list[Obj] = field(default_factory=list)
    untrack_deleted: bool = False  # not failures: drop the finalizer before deleting
    create: list[int | None] = field(default_factory=list)
    index_failures: dict[int, tuple[int, int]] = field(default_factory=dict)
    manage_called: bool = False
    requeue_after: float | None = None


def _requeue(current: float | None, delay: float) -> float:
    return delay if current is None else min(current, delay)


def _valid_index(job: Obj, pod: Obj) -> bool:
    if not is_indexed(job):
        return True
    ix = completion_index(pod)
    return ix is not None and ix < _int((job.get("spec") or {}).get("completions"))


def _index_failed(job: Obj, pod: Obj, only_failed: bool) -> bool:
    """With backoffLimitPerIndex: this failed pod used up its index's retries (or a
    FailIndex rule matched it)."""
    if not pod_failed(pod, only_failed):
        return False
    spec = job.get("spec") or {}
    m = match_pod_failure_policy(spec.get("podFailurePolicy"), pod)
    if m.action == "FailIndex":
        return True
    return m.counts and _annotation_count(pod, INDEX_FAILURE_COUNT) >= _int(spec.get("backoffLimitPerIndex"))


def _delayed_per_index(job: Obj, tracked: Sequence[Obj], succeeded: set[int], failed: set[int],
                       active: Sequence[Obj], only_failed: bool) -> dict[int, Obj]:
    """Per pending index, its latest failed pod: its finalizer stays until the
    replacement exists, because the replacement inherits its failure count."""
    busy = {completion_index(p) for p in active}
    out: dict[int, Obj] = {}
    for p in tracked:
        if not (_valid_index(job, p) and pod_failed(p, only_failed)):
            continue
        ix = completion_index(p)
        assert ix is not None
        if ix in succeeded or ix in failed or ix in busy:
            continue
        prev = out.get(ix)
        total = _annotation_count(p, INDEX_FAILURE_COUNT) + _annotation_count(p, INDEX_IGNORED_FAILURE_COUNT)
        if prev is None:
            out[ix] = p
        else:
            prev_total = _annotation_count(prev, INDEX_FAILURE_COUNT) + \
                _annotation_count(prev, INDEX_IGNORED_FAILURE_COUNT)
            if prev_total <= total and not finished_at(p) < finished_at(prev):
                out[ix] = p
    return out


def _new_index_failures(job: Obj, replaced: Obj | None) -> tuple[int, int]:
    if replaced is None:
        return (0, 0)
    counted = _annotation_count(replaced, INDEX_FAILURE_COUNT)
    ignored = _annotation_count(replaced, INDEX_IGNORED_FAILURE_COUNT)
    return (counted + 1, ignored) if failure_counts(job, replaced) else (counted, ignored + 1)


def _failure(reason: str, message: str) -> Obj:
    return {"type": FAILURE_TARGET, "reason": reason, "message": message}


def assess(obs: Observed) -> Assessment:
    """Count what the pods show, decide whether the Job has failed, and decide
    which pods to delete and which to create (the first half of a sync)."""
    job, pods, now = obs.job, obs.pods, obs.now
    spec = job.get("spec") or {}
    status = copy.deepcopy(job.get("status") or {})
    unc = status.get("uncountedTerminatedPods") or {}
    status["uncountedTerminatedPods"] = {k: list(unc.get(k) or []) for k in ("succeeded", "failed")}
    unc_s, unc_f = set(unc.get("succeeded") or []), set(unc.get("failed") or [])
    indexed = is_indexed(job)
    completions = spec.get("completions")
    n_completions = _int(completions)
    parallelism = _int(spec.get("parallelism"), 1)
    per_index = indexed and spec.get("backoffLimitPerIndex") is not None
    only_failed = replaces_only_failed(job)
    policy = spec.get("podFailurePolicy")
    suspended = spec.get("suspend") is True

    tracked = [p for p in pods if has_tracking_finalizer(p) and _uid(p) not in obs.removing]
    active = [p for p in pods if is_active(p)]
    terminating = sum(1 for p in pods if is_terminating(p))
    ready = sum(1 for p in active if is_ready(p))
    new_succeeded = [p for p in tracked if phase(p) == "Succeeded" and _uid(p) not in unc_s
                     and _valid_index(job, p)]
    new_failed = [p for p in tracked if pod_failed(p, only_failed) and _uid(p) not in unc_f
                  and _valid_index(job, p)]
    counted_failed = [p for p in new_failed if match_pod_failure_policy(policy, p).counts]
    succeeded = _int(status.get("succeeded")) + len(new_succeeded) + len(unc_s)
    failed = _int(status.get("failed")) + len(counted_failed) + len(unc_f)

    if not status.get("startTime") and not suspended:
        status["startTime"] = fmt_time(now)
    backoff = obs.backoff.updated(new_succeeded, new_failed)
    requeue: float | None = None

    finished: Obj | None = None
    met = get_condition(job, SUCCESS_CRITERIA_MET)
    target = get_condition(job, FAILURE_TARGET)
    if met is not None and met.get("status") == "True":
        finished = {"type": SUCCESS_CRITERIA_MET, "reason": met.get("reason") or "",
                    "message": met.get("message") or ""}
    elif target is not None and target.get("status") == "True":
        finished = _failure(target.get("reason") or "", target.get("message") or "")
    elif policy:
        for p in pods:
            if pod_failed(p, only_failed):
                m = match_pod_failure_policy(policy, p)
                if m.action == "FailJob":
                    finished = _failure(REASON_POD_FAILURE_POLICY, m.message or "")
                    break
    if finished is None:
        start = parse_time(status.get("startTime"))
        deadline = spec.get("activeDeadlineSeconds")
        if failed > _int(spec.get("backoffLimit"), 6) or past_backoff_limit_on_failure(job, pods):
            finished = _failure(REASON_BACKOFF_LIMIT, MSG_BACKOFF_LIMIT)
        elif isinstance(deadline, int) and start is not None and not suspended:
            left = deadline - (now - start).total_seconds()
            if left <= 0:
                finished = _failure(REASON_DEADLINE, MSG_DEADLINE)
            else:
                requeue = _requeue(requeue, left)

    prev_ix: set[int] = set()
    succ_ix: set[int] = set()
    failed_ix: set[int] | None = None
    delayed: dict[int, Obj] = {}
    if indexed:
        prev_ix = parse_indexes(status.get("completedIndexes"), n_completions)
        succ_ix = prev_ix | {ix for p in pods if phase(p) == "Succeeded" and has_tracking_finalizer(p)
                             and _valid_index(job, p) and (ix := completion_index(p)) is not None}
        succeeded = len(succ_ix)
        if per_index:
            failed_ix = parse_indexes(status.get("failedIndexes"), n_completions) | {
                ix for p in pods if has_tracking_finalizer(p) and _valid_index(job, p)
                and _index_failed(job, p, only_failed) and (ix := completion_index(p)) is not None}
            if finished is None:
                max_failed = spec.get("maxFailedIndexes")
                if isinstance(max_failed, int) and len(failed_ix) > max_failed:
                    finished = _failure(REASON_MAX_FAILED_INDEXES, MSG_MAX_FAILED_INDEXES)
                elif failed_ix and len(failed_ix) + len(succ_ix) >= n_completions:
                    finished = _failure(REASON_FAILED_INDEXES, MSG_FAILED_INDEXES)
            delayed = _delayed_per_index(job, tracked, succ_ix, failed_ix, active, only_failed)

    a = Assessment(obs=obs, status=status, tracked=tracked, active=active, ready=ready,
                   terminating=terminating, succeeded=succeeded, failed=failed,
                   uncounted_succeeded=unc_s, uncounted_failed=unc_f, succeeded_indexes=succ_ix,
                   prev_succeeded_indexes=prev_ix, failed_indexes=failed_ix, delayed=delayed,
                   finished=finished, backoff=backoff, requeue_after=requeue)

    if finished is not None:
        # The Job is over: stop what still runs.  Finalizers stay, so these pods
        # are counted (as failures) like any other.
        a.delete = list(active)
        return a
    if not obs.satisfied or _md(job).get("deletionTimestamp"):
        return a
    a.manage_called = True
    if suspended:
        a.delete = pods_for_removal(job, active, len(active))
        a.untrack_deleted = True
        return a
    if completions is None:
        # Work queue: once any pod succeeded, let the others finish, start nothing.
        want = len(active) if succeeded > 0 else parallelism
    else:
        want = max(0, min(n_completions - succeeded, parallelism))
    surplus = pods_for_removal(job, active, max(0, len(active) - want))[:MAX_POD_CREATE_DELETE_PER_SYNC]
    if surplus:
        # One kind of change per sync; deleting wins (Indexed duplicates first).
        a.delete = surplus
        a.untrack_deleted = True
        return a
    busy_terminating = [p for p in pods if is_terminating(p)] if only_failed else []
    missing = want - len(busy_terminating) - len(active)
    if missing <= 0:
        return a
    wait = 0.0 if per_index else backoff.remaining(now)
    if wait > 0:
        a.requeue_after = _requeue(a.requeue_after, max(wait, SYNC_BATCH_PERIOD))
        return a
    missing = min(missing, MAX_POD_CREATE_DELETE_PER_SYNC)
    if not indexed:
        a.create = [None] * missing
        return a
    busy = succ_ix | {ix for p in active + busy_terminating if (ix := completion_index(p)) is not None}
    if failed_ix:
        busy |= failed_ix
    indexes = first_pending_indexes(missing, n_completions, busy)
    if per_index:
        ready_now: list[int] = []
        soonest: float | None = None
        for ix in indexes:
            prev = delayed.get(ix)
            left = 0.0
            if prev is not None:
                total = _annotation_count(prev, INDEX_FAILURE_COUNT) + \
                    _annotation_count(prev, INDEX_IGNORED_FAILURE_COUNT)
                left = remaining_backoff(total + 1, finished_at(prev), now)
            if left <= 0:
                ready_now.append(ix)
            else:
                soonest = left if soonest is None else min(soonest, left)
        if not ready_now and soonest is not None:
            a.requeue_after = _requeue(a.requeue_after, max(soonest, SYNC_BATCH_PERIOD))
            return a
        indexes = ready_now
        a.index_failures = {ix: _new_index_failures(job, delayed.get(ix)) for ix in indexes}
    a.create = list(indexes)
    return a


@dataclass
class IOResult:
    """What the pod writes of a sync achieved."""

    deleted: int = 0
    deleted_ready: int = 0
    delete_failed: bool = False
    created: int = 0
    untracked: frozenset[str] = frozenset()  # pods deleted after dropping their finalizer


@dataclass
class Tracking:
    status: Obj
    remove_finalizers: list[Obj]
    tracked_uids: set[str]
    final: Obj | None  # the terminal condition to add once everything is counted
    terminating: int
    reached_max_uncounted: bool
    events: list[Event]


def _move_uncounted(status: Obj, with_finalizer: set[str]) -> bool:
    """Pods whose finalizer is gone are counted: move them from the uncounted lists
    into the counters.  Returns whether anything moved."""
    unc = status.setdefault("uncountedTerminatedPods", {})
    moved = False
    for key in ("succeeded", "failed"):
        uids = list(unc.get(key) or [])
        keep = [u for u in uids if u in with_finalizer]
        if len(keep) != len(uids):
            status[key] = _int(status.get(key)) + len(uids) - len(keep)
            moved = True
        unc[key] = keep
    return moved


def track(a: Assessment, io: IOResult) -> Tracking:
    """After the pod writes: the status to record (active counts, newly finished
    pods into uncountedTerminatedPods, the interim condition) and which finalizers
    may then be removed (the second half of a sync)."""
    job, now = a.obs.job, a.obs.now
    spec = job.get("spec") or {}
    status = copy.deepcopy(a.status)
    indexed = is_indexed(job)
    only_failed = replaces_only_failed(job)
    policy = spec.get("podFailurePolicy")
    events: list[Event] = []
    active = len(a.active) - io.deleted + io.created
    ready = a.ready - io.deleted_ready
    terminating = a.terminating + io.deleted

    finished = a.finished
    if finished is not None:
        if io.delete_failed or not a.obs.satisfied:
            # Not everything was stopped (or our own writes are unseen): decide again next time.
            finished = None
    else:
        completions = spec.get("completions")
        if completions is None:
            complete = a.succeeded > 0 and active == 0
        else:
            complete = a.succeeded >= _int(completions) and active == 0
        if complete:
            finished = {"type": SUCCESS_CRITERIA_MET, "reason": REASON_COMPLETIONS_REACHED,
                        "message": MSG_COMPLETIONS_REACHED}
        elif a.manage_called:
            conds = status.setdefault("conditions", [])
            if spec.get("suspend") is True:
                if ensure_condition(conds, SUSPENDED, "True", "JobSuspended", "Job suspended", now):
                    events.append(("Normal", "Suspended", "Job suspended"))
            elif ensure_condition(conds, SUSPENDED, "False", "JobResumed", "Job resumed", now):
                events.append(("Normal", "Resumed", "Job resumed"))
                # The deadline measures time spent running, not suspended.
                status["startTime"] = fmt_time(now)

    status["active"] = active
    status["ready"] = ready
    status["terminating"] = terminating

    with_finalizer = {_uid(p) for p in a.tracked}
    _move_uncounted(status, with_finalizer)
    unc = status["uncountedTerminatedPods"]
    failing = finished is not None and finished["type"] == FAILURE_TARGET
    remove: list[Obj] = []
    reached_max = False
    pods = sorted(a.tracked, key=lambda p: completion_index(p) or 0) if indexed else a.tracked
    for p in pods:
        uid = _uid(p)
        if uid in io.untracked:
            continue
        failed_p = pod_failed(p, only_failed)
        if not _can_remove_finalizer(a, p, failed_p, finished):
            continue
        remove.append(p)
        if phase(p) == "Succeeded" and uid not in a.uncounted_failed:
            if not indexed and uid not in a.uncounted_succeeded:
                unc["succeeded"].append(uid)
        elif (failed_p or failing) and uid not in a.uncounted_failed and _valid_index(job, p):
            if match_pod_failure_policy(policy, p).counts:
                unc["failed"].append(uid)
        if len(unc["succeeded"]) + len(unc["failed"]) + (
                len(a.succeeded_indexes - a.prev_succeeded_indexes) if indexed else 0) >= MAX_UNCOUNTED_PODS:
            reached_max = True
            break
    if indexed:
        status["completedIndexes"] = format_indexes(a.succeeded_indexes)
        status["succeeded"] = len(a.succeeded_indexes)
        if a.failed_indexes is not None:
            status["failedIndexes"] = format_indexes(a.failed_indexes)

    final: Obj | None = None
    if finished is not None:
        conds = status.setdefault("conditions", [])
        interim = finished["type"]
        if not any(c.get("type") == interim and c.get("status") == "True" for c in conds):
            conds.append(new_condition(interim, "True", finished["reason"], finished["message"], now))
        final = {"type": FAILED if interim == FAILURE_TARGET else COMPLETE,
                 "reason": finished["reason"], "message": finished["message"]}
    return Tracking(status=status, remove_finalizers=remove, tracked_uids=with_finalizer, final=final,
                    terminating=terminating, reached_max_uncounted=reached_max, events=events)


def _can_remove_finalizer(a: Assessment, pod: Obj, failed: bool, finished: Obj | None) -> bool:
    job = a.obs.job
    if _md(job).get("deletionTimestamp") or finished is not None or phase(pod) == "Succeeded":
        return True
    if not failed:
        return False
    ix = completion_index(pod)
    return not (ix is not None and a.delayed.get(ix) is pod)


def settle(tracking: Tracking, still_tracked: set[str], now: _dt.datetime) -> tuple[Obj, bool]:
    """After the finalizer removals: count the pods that lost it, and finish the Job
    once nothing is left uncounted or terminating.  Returns (status, finished now)."""
    status = copy.deepcopy(tracking.status)
    _move_uncounted(status, still_tracked)
    final = tracking.final
    if final is None or tracking.reached_max_uncounted or tracking.terminating > 0:
        return status, False
    unc = status.get("uncountedTerminatedPods") or {}
    if unc.get("succeeded") or unc.get("failed"):
        return status, False
    conds = status.setdefault("conditions", [])
    ensure_condition(conds, final["type"], "True", final["reason"], final["message"], now)
    if final["type"] == COMPLETE:
        status["completionTime"] = fmt_time(now)
    return status, True


def finished_events(job: Obj, status: Obj, final: Obj) -> list[Event]:
    if final["type"] == COMPLETE:
        out: list[Event] = []
        completions = (job.get("spec") or {}).get("completions")
        if isinstance(completions, int) and _int(status.get("succeeded")) > completions:
            out.append(("Warning", "TooManySucceededPods",
                        "Too many succeeded pods running after completion count reached"))
        out.append(("Normal", "Completed", "Job completed"))
        return out
    return [("Warning", final["reason"], final["message"])]


def ttl_remaining(job: Obj, now: _dt.datetime) -> float | None:
    """Seconds until a finished Job with ttlSecondsAfterFinished may be deleted
    (<= 0: now); None when it never expires (no TTL, not finished, being deleted)."""
    ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
    if not isinstance(ttl, int) or _md(job).get("deletionTimestamp"):
        return None
    done = finish_time(job)
    if done is None:
        return None
    return ttl - (now - done).total_seconds()
