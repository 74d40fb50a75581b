"""The Job controller's pure rules (no I/O, no clock of their own): its names and
limits, small readers of pods and Jobs, completion-index sets ("1,3-5"), the
pod failure policy, the exponential back-off, which pods to stop first and
which indexes to start, the pod built from the template, and conditions.
`job_plan.py` decides one sync with them; `job.py` is the controller loop.
"""

from __future__ import annotations

import copy
import datetime as _dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.api import meta
from fleet.api.conditions import get_condition, is_true
from fleet.api.owners import controller_ref

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


def is_ready(pod: Obj) -> bool:
    return is_true(pod, "Ready")


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
        if is_true(job, ctype):
            return ctype
    return None


def finish_time(job: Obj) -> _dt.datetime | None:
    ctype = job_finished(job)
    if ctype is None:
        return None
    c = get_condition(job, ctype) or {}
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
    ready = get_condition(pod, "Ready")
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
    ready = get_condition(pod, "Ready")
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
