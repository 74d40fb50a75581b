"""Job controller: run pods to completion, count every finish exactly once.

What it does, as kube-controller-manager's job controller (1.31+ behaviour):

* **Pods.**  `parallelism` pods at a time, never more than the completions still
  missing (`completions` unset is the work-queue mode: once one pod succeeded no
  new pod starts and the Job completes when the rest have finished).  Indexed Jobs
  give each pod a completion index — `<job>-<index>-<rand>` names, the
  `batch.kubernetes.io/job-completion-index` annotation and label, hostname
  `<job>-<index>` and `JOB_COMPLETION_INDEX` read from that annotation through the
  downward API — and each index must succeed once.  Failed pods are replaced after
  an exponential back-off (10 s doubling, capped at 6 minutes), per Job or, with
  `backoffLimitPerIndex`, per index.
* **Counting with a finalizer.**  Every pod is created with the
  `batch.kubernetes.io/job-tracking` finalizer, so it cannot disappear before it
  is counted.  A finished pod is first written into
  `status.uncountedTerminatedPods` (Indexed successes straight into
  `completedIndexes`), then its finalizer is removed, then the uid moves from the
  uncounted list into `succeeded` / `failed`.  Every step is recorded before the
  next one starts, so a crash between any two loses nothing and counts nothing
  twice; every status write carries the resourceVersion it was computed from, so
  a stale cache can never write a stale count.
* **Ending.**  `backoffLimit`, `activeDeadlineSeconds`, `podFailurePolicy`
  (FailJob / FailIndex / Ignore / Count on exit codes and pod conditions) and
  `maxFailedIndexes` fail the Job; reaching its completions completes it.  As in
  Kubernetes 1.31, the decision is first written as an interim condition
  (`FailureTarget` / `SuccessCriteriaMet`), remaining pods are stopped, and
  `Failed` / `Complete` follow only when no pod is left terminating.
* **Suspend** deletes the active pods (not counted as failures: their finalizer
  is removed first) and sets `Suspended`; resuming restarts the deadline clock.
* **ttlSecondsAfterFinished** deletes the finished Job (propagation Background;
  the garbage collector removes its pods).

The decisions are pure functions — `assess` (what to create and delete),
`track` (what to count, which finalizers to remove), `settle` (moving counted
pods into the counters and finishing) — around a thin I/O loop in
`JobController.reconcile`.  Wall-clock times (startTime, deadlines, back-off
from pod finish times, TTL) come from an injectable `now`; waits are queue
delays on Trio's clock, so MockClock tests drive the whole controller.

Deviations from Kubernetes are listed in docs/compat.md ("Job and CronJob").
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import meta
from fleet.api.owners import adopt_patch, controller_of, controller_ref
from fleet.api.selectors import label_selector_from_dict
from fleet.client import JSON_PATCH, STRATEGIC_MERGE_PATCH, ApiException
from fleet.controllers.runtime import (
    Context,
    Expectations,
    QueueWorker,
    SharedInformer,
    WorkQueue,
    by_controller_uid,
    key_of,
    split_key,
)

log = logging.getLogger(__name__)

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED_FAILURE_COUNT = "batch.kubernetes.io/job-index-ignored-failure-count"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
COMPLETION_INDEX_FIELD = f"metadata.annotations['{COMPLETION_INDEX}']"

POD_FAILURE_BACKOFF = 10.0
MAX_POD_FAILURE_BACKOFF = 360.0
# Bounds on one sync, as Kubernetes: the uncounted lists stay small (~20 KB of
# uids) and one huge Job cannot starve the others.
MAX_UNCOUNTED_PODS = 500
MAX_POD_CREATE_DELETE_PER_SYNC = 500
# Pod events within this window are handled by one sync (a burst of pod status
# changes costs one status write, not one each).
SYNC_BATCH_PERIOD = 1.0
SLOW_START_INITIAL_BATCH = 1
MAX_GENERATED_NAME = 58  # 63 minus the 5-character random suffix
INT32_MAX = 2147483647

POD_OWNER_INDEX = "controller-uid"

COMPLETE, FAILED = "Complete", "Failed"
SUCCESS_CRITERIA_MET, FAILURE_TARGET = "SuccessCriteriaMet", "FailureTarget"
SUSPENDED = "Suspended"

REASON_COMPLETIONS_REACHED = "CompletionsReached"
MSG_COMPLETIONS_REACHED = "Reached expected number of succeeded pods"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
MSG_BACKOFF_LIMIT = "Job has reached the specified backoff limit"
REASON_DEADLINE = "DeadlineExceeded"
MSG_DEADLINE = "Job was active longer than specified deadline"
REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
REASON_MAX_FAILED_INDEXES = "MaxFailedIndexesExceeded"
MSG_MAX_FAILED_INDEXES = "Job has exceeded the specified maximal number of failed indexes"
REASON_FAILED_INDEXES = "FailedIndexes"
MSG_FAILED_INDEXES = "Job has failed indexes"

Obj = dict[str, Any]
Event = tuple[str, str, str]  # (type, reason, message)


# ---------------------------------------------------------------------------------------
# Small readers


def _md(o: Obj) -> Obj:
    return o.get("metadata") or {}


def _uid(o: Obj) -> str:
    return str(_md(o).get("uid") or "")


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def fmt_time(t: _dt.datetime) -> str:
    return t.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


parse_time = meta.parse_time


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def has_tracking_finalizer(pod: Obj) -> bool:
    return TRACKING_FINALIZER in (_md(pod).get("finalizers") or [])


def deletion_finished(pod: Obj) -> bool:
    """The node is done with a deleted pod.

    Kubernetes' kubelet moves a pod to a terminal phase before its final delete;
    Fleet's agent (and the simulator) go straight to the final DELETE with
    gracePeriodSeconds=0, which — while our finalizer holds the object — shows as
    deletionGracePeriodSeconds 0.  That is the same fact: nothing runs any more."""
    md = _md(pod)
    return bool(md.get("deletionTimestamp")) and md.get("deletionGracePeriodSeconds") == 0


def is_terminated(pod: Obj) -> bool:
    return phase(pod) in ("Succeeded", "Failed") or deletion_finished(pod)


def is_active(pod: Obj) -> bool:
    """Counts toward parallelism: not finished and not being deleted."""
    return phase(pod) not in ("Succeeded", "Failed") and not _md(pod).get("deletionTimestamp")


def is_terminating(pod: Obj) -> bool:
    return bool(_md(pod).get("deletionTimestamp")) and not is_terminated(pod)


def _condition(obj: Obj, ctype: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def _condition_true(obj: Obj, ctype: str) -> bool:
    c = _condition(obj, ctype)
    return c is not None and c.get("status") == "True"


def is_ready(pod: Obj) -> bool:
    return _condition_true(pod, "Ready")


def completion_index(pod: Obj) -> int | None:
    raw = (_md(pod).get("annotations") or {}).get(COMPLETION_INDEX)
    try:
        ix = int(str(raw))
    except (TypeError, ValueError):
        return None
    return ix if ix >= 0 else None


def _annotation_count(pod: Obj, key: str) -> int:
    try:
        n = int(str((_md(pod).get("annotations") or {}).get(key, "0")))
    except ValueError:
        return 0
    return n if 0 <= n <= INT32_MAX else 0


def job_finished(job: Obj) -> str | None:
    """"Complete" or "Failed" once the Job has its terminal condition, else None."""
    for ctype in (COMPLETE, FAILED):
        if _condition_true(job, ctype):
            return ctype
    return None


def finish_time(job: Obj) -> _dt.datetime | None:
    ctype = job_finished(job)
    if ctype is None:
        return None
    c = _condition(job, ctype) or {}
    return parse_time(c.get("lastTransitionTime")) or parse_time((job.get("status") or {}).get("completionTime"))


def is_indexed(job: Obj) -> bool:
    return (job.get("spec") or {}).get("completionMode") == "Indexed"


def replaces_only_failed(job: Obj) -> bool:
    """podReplacementPolicy Failed (implied by a pod failure policy): a deleted pod
    is replaced only once it has really stopped."""
    spec = job.get("spec") or {}
    return spec.get("podReplacementPolicy") == "Failed" or spec.get("podFailurePolicy") is not None


def pod_failed(pod: Obj, only_failed_phase: bool) -> bool:
    """Does this pod count as a failure (before any pod failure policy)?

    Phase Failed always; a pod deleted without succeeding too — once it has
    stopped, or (TerminatingOrFailed) as soon as it is marked, which is how
    Kubernetes counts pods lost with their node."""
    p = phase(pod)
    if p == "Failed":
        return True
    if p == "Succeeded":
        return False
    if deletion_finished(pod):
        return True
    return not only_failed_phase and bool(_md(pod).get("deletionTimestamp"))


# ---------------------------------------------------------------------------------------
# Completion index sets ("1,3-5" as in status.completedIndexes)


def parse_indexes(text: Any, completions: int) -> set[int]:
    """Indexes below `completions` from the status form; malformed parts are skipped."""
    out: set[int] = set()
    if not isinstance(text, str) or not text:
        return out
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if hi else first
        except ValueError:
            continue
        if first >= completions:
            break
        out.update(range(max(first, 0), min(last, completions - 1) + 1))
    return out


def format_indexes(indexes: Iterable[int]) -> str:
    """Sorted runs: "0-2,5,7,8" (two consecutive indexes are written "7,8", as Kubernetes)."""
    parts: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        if last == first:
            parts.append(str(first))
        elif last == first + 1:
            parts.append(f"{first},{last}")
        else:
            parts.append(f"{first}-{last}")

    for ix in sorted(set(indexes)):
        if run and ix == run[-1] + 1:
            run.append(ix)
        else:
            flush()
            run = [ix]
    flush()
    return ",".join(parts)


# ---------------------------------------------------------------------------------------
# Pod failure policy


@dataclass(frozen=True)
class PolicyMatch:
    """What the pod failure policy says about a failed pod."""

    action: str | None = None  # FailJob, FailIndex, Ignore, Count; None when no rule matched
    message: str | None = None  # FailJob's reason for the Job's condition

    @property
    def counts(self) -> bool:
        """Does the failure count toward backoffLimit (and the index's limit)?"""
        return self.action != "Ignore"


def _terminated_matching(statuses: Any, req: Obj) -> Obj | None:
    name = req.get("containerName")
    values = req.get("values") or []
    for cs in statuses or []:
        if not isinstance(cs, dict):
            continue
        term = (cs.get("state") or {}).get("terminated")
        if not isinstance(term, dict):
            continue  # still running or waiting: no exit code to judge
        if name is not None and cs.get("name") != name:
            continue
        code = _int(term.get("exitCode"))
        if code == 0:
            continue  # success is never a failure cause
        op = req.get("operator")
        if (op == "In" and code in values) or (op == "NotIn" and code not in values):
            return cs
    return None


def match_pod_failure_policy(policy: Obj | None, pod: Obj) -> PolicyMatch:
    """The first rule matching a failed pod: exit codes of app containers, then of
    init containers; or a pod condition with the given status."""
    if not policy:
        return PolicyMatch()
    st = pod.get("status") or {}
    md = _md(pod)
    for i, rule in enumerate(policy.get("rules") or []):
        if not isinstance(rule, dict):
            continue
        action = rule.get("action")
        req = rule.get("onExitCodes")
        if isinstance(req, dict):
            cs = _terminated_matching(st.get("containerStatuses"), req) or \
                _terminated_matching(st.get("initContainerStatuses"), req)
            if cs is None:
                continue
            code = cs["state"]["terminated"].get("exitCode")
            msg = (f"Container {cs.get('name')} for pod {md.get('namespace')}/{md.get('name')} "
                   f"failed with exit code {code} matching {action} rule at index {i}")
        elif isinstance(rule.get("onPodConditions"), list):
            patterns = [p for p in rule["onPodConditions"] if isinstance(p, dict)]
            hit = next((c for c in st.get("conditions") or [] if isinstance(c, dict) and any(
                c.get("type") == p.get("type") and c.get("status") == (p.get("status") or "True")
                for p in patterns)), None)
            if hit is None:
                continue
            msg = (f"Pod {md.get('namespace')}/{md.get('name')} has condition {hit.get('type')} "
                   f"matching {action} rule at index {i}")
        else:
            continue
        if action in ("Ignore", "Count", "FailIndex"):
            return PolicyMatch(action)
        if action == "FailJob":
            return PolicyMatch(action, msg)
    return PolicyMatch()


def failure_counts(job: Obj, pod: Obj) -> bool:
    return match_pod_failure_policy((job.get("spec") or {}).get("podFailurePolicy"), pod).counts


# ---------------------------------------------------------------------------------------
# Back-off


def finished_at(pod: Obj) -> _dt.datetime:
    """When a pod finished (Kubernetes' order of evidence): the last container's
    finishedAt, else Ready=False's transition, else deletion time minus grace,
    else its creation."""
    st = pod.get("status") or {}
    latest: _dt.datetime | None = None
    statuses = [cs for cs in st.get("containerStatuses") or [] if isinstance(cs, dict)]
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        t = parse_time(term.get("finishedAt")) if isinstance(term, dict) else None
        if t is None:  # some container has not finished: this evidence does not apply
            latest = None
            break
        latest = t if latest is None or t > latest else latest
    if latest is not None:
        return latest
    ready = _condition(pod, "Ready")
    if ready is not None and ready.get("status") == "False":
        t = parse_time(ready.get("lastTransitionTime"))
        if t is not None:
            return t
    md = _md(pod)
    deleted = parse_time(md.get("deletionTimestamp"))
    if deleted is not None:
        return deleted - _dt.timedelta(seconds=_int(md.get("deletionGracePeriodSeconds")))
    return parse_time(md.get("creationTimestamp")) or _dt.datetime.fromtimestamp(0, _dt.UTC)


def backoff_delay(failures: int) -> float:
    """10 s after the first failure, doubling per consecutive failure, capped."""
    if failures <= 0:
        return 0.0
    delay = POD_FAILURE_BACKOFF
    for _ in range(1, failures):
        delay *= 2
        if delay >= MAX_POD_FAILURE_BACKOFF:
            return MAX_POD_FAILURE_BACKOFF
    return delay


def remaining_backoff(failures: int, last_failure: _dt.datetime | None, now: _dt.datetime) -> float:
    if failures <= 0 or last_failure is None:
        return 0.0
    elapsed = (now - last_failure).total_seconds()
    return max(0.0, backoff_delay(failures) - elapsed)


@dataclass(frozen=True)
class Backoff:
    """Consecutive failures since the last success, per Job (in memory, as Kubernetes)."""

    failures: int = 0
    last_failure: _dt.datetime | None = None

    def updated(self, succeeded: Sequence[Obj], failed: Sequence[Obj]) -> Backoff:
        """Fold newly finished pods in: a success resets the count, except for
        failures that finished after it."""
        if not succeeded:
            if not failed:
                return self
            last = max(finished_at(p) for p in failed)
            return Backoff(self.failures + len(failed), last)
        last_success = max(finished_at(p) for p in succeeded)
        later = sorted(finished_at(p) for p in failed if finished_at(p) > last_success)
        return Backoff(len(later), later[-1] if later else None)

    def remaining(self, now: _dt.datetime) -> float:
        return remaining_backoff(self.failures, self.last_failure, now)


# ---------------------------------------------------------------------------------------
# Which pods to stop first, which indexes to start


def _ts(value: Any) -> float:
    t = parse_time(value)
    return t.timestamp() if t else 0.0


def _removal_order(pod: Obj) -> tuple[Any, ...]:
    """Sort key putting the pods cheapest to lose first (client-go's ActivePods):
    unscheduled, then pending, then not ready, then ready for the shortest time,
    then most restarted, then newest."""
    st = pod.get("status") or {}
    rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(phase(pod), 0)
    ready = _condition(pod, "Ready")
    is_rdy = ready is not None and ready.get("status") == "True"
    ready_since = _ts(ready.get("lastTransitionTime")) if is_rdy and ready else 0.0
    restarts = sum(_int(c.get("restartCount")) for c in st.get("containerStatuses") or [] if isinstance(c, dict))
    return (bool((pod.get("spec") or {}).get("nodeName")), rank, is_rdy, -ready_since, -restarts,
            -_ts(_md(pod).get("creationTimestamp")))


def pods_for_removal(job: Obj, active: Sequence[Obj], at_least: int) -> list[Obj]:
    """Active pods to delete: for Indexed Jobs every pod without a valid index and
    all but one pod per index; then the cheapest pods until `at_least` are chosen."""
    rm: list[Obj] = []
    left: list[Obj] = list(active)
    if is_indexed(job):
        completions = _int((job.get("spec") or {}).get("completions"))
        by_index: dict[int, list[Obj]] = {}
        left = []
        for p in active:
            ix = completion_index(p)
            if ix is None or ix >= completions:
                rm.append(p)
            else:
                by_index.setdefault(ix, []).append(p)
        for ix in sorted(by_index):
            group = sorted(by_index[ix], key=_removal_order)
            rm.extend(group[:-1])  # keep the one furthest along
            left.append(group[-1])
    if len(rm) < at_least:
        rm.extend(sorted(left, key=_removal_order)[:at_least - len(rm)])
    return rm


def first_pending_indexes(count: int, completions: int, busy: Iterable[int]) -> list[int]:
    """The `count` smallest indexes below `completions` not in `busy`."""
    taken = set(busy)
    out: list[int] = []
    ix = 0
    while ix < completions and len(out) < count:
        if ix not in taken:
            out.append(ix)
        ix += 1
    return out


def past_backoff_limit_on_failure(job: Obj, pods: Sequence[Obj]) -> bool:
    """restartPolicy OnFailure: container restarts in live pods count as failures."""
    spec = job.get("spec") or {}
    if ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") != "OnFailure":
        return False
    restarts = 0
    for p in pods:
        if phase(p) in ("Running", "Pending"):
            st = p.get("status") or {}
            for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
                if isinstance(cs, dict):
                    restarts += _int(cs.get("restartCount"))
    limit = _int(spec.get("backoffLimit"), 6)
    return restarts > 0 if limit == 0 else restarts >= limit


# ---------------------------------------------------------------------------------------
# Pods from the template


def _generate_name(job_name: str, index: int | None) -> str:
    if index is None:
        prefix = f"{job_name}-"
        return prefix[:MAX_GENERATED_NAME]
    suffix = f"-{index}-"
    prefix = f"{job_name}{suffix}"
    if len(prefix) > MAX_GENERATED_NAME:
        prefix = prefix[:MAX_GENERATED_NAME - len(suffix)] + suffix
    return prefix


def _add_index_env(container: Obj) -> None:
    env = container.get("env")
    if not isinstance(env, list):
        env = container["env"] = []
    if any(isinstance(e, dict) and e.get("name") == COMPLETION_INDEX_ENV for e in env):
        return
    env.append({"name": COMPLETION_INDEX_ENV,
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": COMPLETION_INDEX_FIELD}}})


def build_pod(job: Obj, index: int | None = None,
              index_failures: tuple[int, int] | None = None) -> Obj:
    """The pod a Job creates: its template, owned by the Job, with the tracking
    finalizer and, for an Indexed Job, the index in name, annotation, label,
    hostname and environment."""
    md = _md(job)
    name = str(md.get("name") or "")
    template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    tmeta = template.get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    annotations = dict(tmeta.get("annotations") or {})
    finalizers = [f for f in tmeta.get("finalizers") or [] if isinstance(f, str)]
    if TRACKING_FINALIZER not in finalizers:
        finalizers.append(TRACKING_FINALIZER)
    spec = template.get("spec") or {}
    if index is not None:
        annotations[COMPLETION_INDEX] = str(index)
        labels[COMPLETION_INDEX] = str(index)
        hostname = f"{name}-{index}"
        if not spec.get("hostname") and len(hostname) <= 63:
            spec["hostname"] = hostname
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if isinstance(c, dict):
                _add_index_env(c)
        if index_failures is not None:
            counted, ignored = index_failures
            annotations[INDEX_FAILURE_COUNT] = str(counted)
            if ignored > 0:
                annotations[INDEX_IGNORED_FAILURE_COUNT] = str(ignored)
    pod_md: Obj = {
        "generateName": _generate_name(name, index),
        "namespace": md.get("namespace"),
        "labels": labels,
        "finalizers": finalizers,
        "ownerReferences": [controller_ref(job, api_version="batch/v1", kind="Job")],
    }
    if annotations:
        pod_md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_md, "spec": spec}


# ---------------------------------------------------------------------------------------
# Conditions and status


def new_condition(ctype: str, status: str, reason: str, message: str, now: _dt.datetime) -> Obj:
    ts = fmt_time(now)
    return {"type": ctype, "status": status, "lastProbeTime": ts, "lastTransitionTime": ts,
            "reason": reason, "message": message}


def ensure_condition(conditions: list[Obj], ctype: str, status: str, reason: str, message: str,
                     now: _dt.datetime) -> bool:
    """Set a condition (in place); a False condition is never added, only updated.
    Returns whether anything changed."""
    for i, c in enumerate(conditions):
        if c.get("type") == ctype:
            if (c.get("status"), c.get("reason"), c.get("message")) != (status, reason, message):
                conditions[i] = new_condition(ctype, status, reason, message, now)
                return True
            return False
    if status == "False":
        return False
    conditions.append(new_condition(ctype, status, reason, message, now))
    return True


def normalize_status(status: Obj) -> Obj:
    """The status as Kubernetes serializes it (zero counters and empty lists
    omitted), so that comparing it with the stored one means something."""
    out = dict(status)
    for k in ("active", "succeeded", "failed"):
        if not out.get(k):
            out.pop(k, None)
    unc = dict(out.get("uncountedTerminatedPods") or {})
    for k in ("succeeded", "failed"):
        if not unc.get(k):
            unc.pop(k, None)
    out["uncountedTerminatedPods"] = unc
    if not out.get("completedIndexes"):
        out.pop("completedIndexes", None)
    if not out.get("conditions"):
        out.pop("conditions", None)
    return out


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
    met = _condition(job, SUCCESS_CRITERIA_MET)
    target = _condition(job, FAILURE_TARGET)
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


# ---------------------------------------------------------------------------------------
# The controller


def _remove_finalizer_patch() -> Obj:
    return {"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}}


class JobController(QueueWorker):
    """Reconciles Jobs (and releases tracking finalizers of pods whose Job is gone)."""

    name = "job"
    workers = 3

    def __init__(self, *, now: Callable[[], _dt.datetime] = meta.utcnow,
                 batch_period: float = SYNC_BATCH_PERIOD) -> None:
        super().__init__()
        self.now = now
        self.batch_period = batch_period
        self.expectations = Expectations()
        self.orphans = WorkQueue()
        self._removing: dict[str, set[str]] = {}
        self._backoff: dict[str, Backoff] = {}

    # -- wiring -----------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.jobs: SharedInformer = ctx.informers.informer("batch/v1", "jobs")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.pods.add_index(POD_OWNER_INDEX, by_controller_uid)
        self.jobs.add_handler(self._on_job)
        self.pods.add_handler(self._on_pod)

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(super().run, ctx)
            n.start_soon(self._orphan_worker)

    def _record(self, obj: Obj, events: Iterable[Event]) -> None:
        if self.ctx.events is None:
            return
        for type_, reason, message in events:
            self.ctx.events.record(obj, type_, reason, message)

    def _job_of(self, pod: Obj) -> Obj | None:
        ref = controller_of(pod)
        if not ref or ref.get("kind") != "Job":
            return None
        job = self.jobs.get(f"{_md(pod).get('namespace') or ''}/{ref.get('name')}")
        if job is None or _uid(job) != ref.get("uid"):
            return None
        return job

    def _on_job(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        job = new if new is not None else old
        if job is None:
            return
        key = key_of(job)
        if etype == "DELETED" or (new is not None and job_finished(new)):
            # Pods left holding our finalizer would never go away otherwise.
            for p in self.pods.by_index(POD_OWNER_INDEX, _uid(job)):
                if has_tracking_finalizer(p):
                    self.orphans.add(key_of(p))
        if etype == "MODIFIED" and old is not None and new is not None and \
                _md(old).get("generation") == _md(new).get("generation"):
            self.queue.add_after(key, self.batch_period)  # our own status writes
        else:
            self.queue.add(key)

    def _on_pod(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        pod = new if new is not None else old
        if pod is None:
            return
        uid = _uid(pod)
        if etype == "MODIFIED" and old is not None and new is not None:
            if _md(old).get("resourceVersion") == _md(new).get("resourceVersion"):
                return
            old_ref, new_ref = controller_of(old), controller_of(new)
            if old_ref != new_ref and old_ref is not None:
                old_job = self._job_of(old)
                if old_job is not None:
                    self._observe_removal(key_of(old_job), uid, new)
                    self.queue.add_after(key_of(old_job), self.batch_period)
        job = self._job_of(pod)
        if job is None:
            if new is not None and has_tracking_finalizer(new):
                self.orphans.add(key_of(new))
            return
        key = key_of(job)
        if etype == "ADDED":
            if _md(pod).get("deletionTimestamp"):
                self.expectations.deletion_observed(key, uid)
            else:
                self.expectations.creation_observed(key)
        elif etype == "DELETED":
            self.expectations.deletion_observed(key, uid)
            self._observe_removal(key, uid, None)
        else:
            if _md(pod).get("deletionTimestamp"):
                self.expectations.deletion_observed(key, uid)
            self._observe_removal(key, uid, new)
        if job_finished(job) and new is not None and has_tracking_finalizer(new):
            self.orphans.add(key_of(new))
        self.queue.add_after(key, self.batch_period)

    def _observe_removal(self, key: str, uid: str, pod: Obj | None) -> None:
        if pod is None or not has_tracking_finalizer(pod):
            pending = self._removing.get(key)
            if pending is not None:
                pending.discard(uid)
                if not pending:
                    del self._removing[key]

    # -- reconcile --------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        try:
            return await self._sync(key)
        except ApiException as e:
            if e.code != 409:
                raise
            # Our copy of the Job was stale.  A newer version exists and its watch
            # event brings the Job back; a quiet look later covers the rest.
            log.debug("job %s: %s", key, e)
            return self.batch_period

    async def _sync(self, key: str) -> float | None:
        job = self.jobs.get(key)
        if job is None:
            self.expectations.forget(key)
            self._removing.pop(key, None)
            self._backoff.pop(key, None)
            return None
        if job_finished(job):
            self._backoff.pop(key, None)
            return await self._expire(job)
        if (job.get("spec") or {}).get("completionMode") not in (None, "NonIndexed", "Indexed"):
            self._record(job, [("Warning", "UnknownCompletionMode",
                                "Skipped Job sync because completion mode is unknown")])
            return None
        # Expectations first: a pod that appears after this point defers the decision.
        satisfied = self.expectations.satisfied(key)
        pods = await self._pods_for(job)
        now = self.now()
        a = assess(Observed(job=job, pods=pods, now=now, backoff=self._backoff.get(key, Backoff()),
                            removing=frozenset(self._removing.get(key, ())), satisfied=satisfied))
        io = await self._write_pods(key, job, a)
        t = track(a, io)
        status = normalize_status(t.status)
        current = job
        if status != normalize_status(job.get("status") or {}):
            current = await self._write_status(job, status)
            self._backoff[key] = a.backoff
        self._record(current, t.events)
        removed, remove_error = await self._remove_finalizers(key, t.remove_finalizers)
        settled, done = settle(t, t.tracked_uids - removed, self.now())
        settled = normalize_status(settled)
        if settled != normalize_status(current.get("status") or {}):
            current = await self._write_status(current, settled)
        if done and t.final is not None:
            self._record(current, finished_events(current, settled, t.final))
        if remove_error is not None:
            raise remove_error
        return a.requeue_after

    async def _pods_for(self, job: Obj) -> list[Obj]:
        pods = self.pods.by_index(POD_OWNER_INDEX, _uid(job))
        spec = job.get("spec") or {}
        if spec.get("manualSelector") is True and not _md(job).get("deletionTimestamp"):
            pods += await self._adopt(job, spec.get("selector"))
        return pods

    async def _adopt(self, job: Obj, selector: Any) -> list[Obj]:
        """Orphans matching a manual selector become this Job's (with our finalizer)."""
        try:
            sel = label_selector_from_dict(selector)
        except Exception:  # noqa: BLE001 - validation refuses bad selectors; never adopt on one
            return []
        md = _md(job)
        adopted: list[Obj] = []
        for p in self.pods.list(md.get("namespace") or ""):
            pmd = _md(p)
            if controller_of(p) is not None or pmd.get("deletionTimestamp") or is_terminated(p):
                continue
            if not sel.matches(pmd.get("labels") or {}):
                continue
            ops = adopt_patch(p, job, api_version="batch/v1", kind="Job", finalizers=[TRACKING_FINALIZER])
            try:
                got = await self.ctx.client.patch("v1", "pods", pmd["name"], ops, JSON_PATCH,
                                                  pmd.get("namespace"))
            except ApiException as e:
                if e.code in (404, 409, 422):
                    continue
                raise
            adopted.append(got)
        return adopted

    async def _write_pods(self, key: str, job: Obj, a: Assessment) -> IOResult:
        io = IOResult()
        if a.delete:
            await self._delete_pods(key, job, a, io)
        if a.create:
            await self._create_pods(key, job, a, io)
        return io

    async def _delete_pods(self, key: str, job: Obj, a: Assessment, io: IOResult) -> None:
        uids = [_uid(p) for p in a.delete]
        if a.manage_called:
            self.expectations.expect_deletions(key, uids)
        untracked: set[str] = set()
        failures: list[Exception] = []

        async def one(pod: Obj) -> None:
            pmd = _md(pod)
            ns, name, uid = pmd.get("namespace"), pmd.get("name"), _uid(pod)
            try:
                if a.untrack_deleted and has_tracking_finalizer(pod):
                    await self.ctx.client.patch("v1", "pods", name, _remove_finalizer_patch(),
                                                STRATEGIC_MERGE_PATCH, ns)
                    untracked.add(uid)
                await self.ctx.client.delete("v1", "pods", name, ns,
                                             body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                   "preconditions": {"uid": uid}})
            except ApiException as e:
                if a.manage_called:
                    self.expectations.deletion_observed(key, uid)
                if e.code != 404:
                    io.delete_failed = True
                    failures.append(e)
                    self._record(job, [("Warning", "FailedDelete", f"Error deleting: {e}")])
                    return
            io.deleted += 1
            if is_ready(pod):
                io.deleted_ready += 1
            self._record(job, [("Normal", "SuccessfulDelete", f"Deleted pod: {name}")])

        async with trio.open_nursery() as n:
            for p in a.delete:
                n.start_soon(one, p)
        io.untracked = frozenset(untracked)
        if failures:
            log.info("job %s: %d pod deletions failed: %s", key, len(failures), failures[0])

    async def _create_pods(self, key: str, job: Obj, a: Assessment, io: IOResult) -> None:
        """Create in slow-start batches (1, 2, 4, ...): if pods cannot be created
        (a quota, a bad template) one failure stops the rest instead of hundreds."""
        todo = list(a.create)
        self.expectations.expect_creations(key, len(todo))
        batch = min(len(todo), SLOW_START_INITIAL_BATCH)
        ns = _md(job).get("namespace")
        while todo:
            chunk, todo = todo[:batch], todo[batch:]
            errors: list[ApiException] = []

            async def one(index: int | None, errors: list[ApiException] = errors) -> None:
                body = build_pod(job, index, a.index_failures.get(index) if index is not None else None)
                try:
                    got = await self.ctx.client.create("v1", "pods", body, ns)
                except ApiException as e:
                    self.expectations.creation_failed(key)
                    errors.append(e)
                    if e.code in (403, 404) and "terminat" in str(e).lower():
                        return  # the namespace is going away: nothing to report
                    self._record(job, [("Warning", "FailedCreate", f"Error creating: {e}")])
                    return
                io.created += 1
                self._record(job, [("Normal", "SuccessfulCreate", f"Created pod: {_md(got).get('name')}")])

            async with trio.open_nursery() as n:
                for index in chunk:
                    n.start_soon(one, index)
            if errors:
                for _ in todo:  # never attempted: not expected either
                    self.expectations.creation_failed(key)
                log.info("job %s: pod creation failed: %s", key, errors[0])
                return
            batch = min(2 * batch, len(todo))

    async def _write_status(self, job: Obj, status: Obj) -> Obj:
        """PUT the status subresource, based on the revision we computed from (409 if stale)."""
        body = copy.deepcopy(job)
        body["status"] = status
        md = _md(job)
        return await self.ctx.client.replace("batch/v1", "jobs", md["name"], body, md.get("namespace"),
                                             subresource="status")

    async def _remove_finalizers(self, key: str, pods: Sequence[Obj]) -> tuple[set[str], Exception | None]:
        """Drop our finalizer from counted pods; returns the uids done (or already gone)."""
        if not pods:
            return set(), None
        pending = self._removing.setdefault(key, set())
        pending.update(_uid(p) for p in pods)
        done: set[str] = set()
        error: list[Exception] = []

        async def one(pod: Obj) -> None:
            pmd, uid = _md(pod), _uid(pod)
            try:
                await self.ctx.client.patch("v1", "pods", pmd["name"], _remove_finalizer_patch(),
                                            STRATEGIC_MERGE_PATCH, pmd.get("namespace"))
            except ApiException as e:
                pending.discard(uid)
                if e.code == 404:
                    done.add(uid)
                else:
                    error.append(e)
                return
            done.add(uid)

        async with trio.open_nursery() as n:
            for p in pods:
                n.start_soon(one, p)
        if not pending:
            self._removing.pop(key, None)
        return done, (error[0] if error else None)

    async def _expire(self, job: Obj) -> float | None:
        """ttlSecondsAfterFinished: delete the Job once its time is up."""
        left = ttl_remaining(job, self.now())
        if left is None:
            return None
        if left > 0:
            return left
        md = _md(job)
        try:
            # The cache may be behind an edit of the TTL: decide on a fresh copy.
            fresh = await self.ctx.client.get_object("batch/v1", "jobs", md["name"], md.get("namespace"))
        except ApiException as e:
            if e.code == 404:
                return None
            raise
        left = ttl_remaining(fresh, self.now())
        if left is None or _uid(fresh) != _uid(job):
            return None
        if left > 0:
            return left
        try:
            await self.ctx.client.delete(
                "batch/v1", "jobs", md["name"], md.get("namespace"),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                      "preconditions": {"uid": _uid(fresh)}})
        except ApiException as e:
            if e.code not in (404, 409):
                raise
        return None

    # -- pods whose Job is gone -------------------------------------------------------------
    async def _orphan_worker(self) -> None:
        while True:
            key = await self.orphans.get()
            try:
                await self._release_orphan(key)
            except Exception as e:  # noqa: BLE001 - keep going, retry with back-off
                log.info("job: releasing pod %s failed: %r", key, e)
                self.orphans.add_rate_limited(key)
            else:
                self.orphans.forget(key)
            finally:
                self.orphans.done(key)

    async def _release_orphan(self, key: str) -> None:
        """Remove our finalizer from a pod no live Job tracks any more."""
        pod = self.pods.get(key)
        if pod is None or not has_tracking_finalizer(pod):
            return
        ns, name = split_key(key)
        ref = controller_of(pod)
        if ref is not None:
            if ref.get("kind") != "Job" or ref.get("apiVersion") != "batch/v1":
                return  # someone else's pod: not ours to touch
            job = self.jobs.get(f"{ns}/{ref.get('name')}")
            if job is None:
                try:
                    job = await self.ctx.client.get_object("batch/v1", "jobs", str(ref.get("name")), ns)
                except ApiException as e:
                    if e.code != 404:
                        raise
            if job is not None and _uid(job) == ref.get("uid") and not job_finished(job):
                return  # alive: its own sync counts this pod
        try:
            await self.ctx.client.patch("v1", "pods", name, _remove_finalizer_patch(),
                                        STRATEGIC_MERGE_PATCH, ns)
        except ApiException as e:
            if e.code != 404:
                raise
