"""The Job controller: its pure decisions (tables) and the whole loop under MockClock.

The loop tests run `JobController` against `FakeCluster` (tests/unit/controllers/
batch_fake.py): the test plays the nodes, moving pods to Running, Succeeded or
Failed, and measures the controller's waits on the MockClock.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from fleet.controllers.job import JobController
from fleet.controllers.job_plan import IOResult, Observed, assess, settle, track, ttl_remaining
from fleet.controllers.job_rules import (
    COMPLETION_INDEX,
    INDEX_FAILURE_COUNT,
    MAX_POD_FAILURE_BACKOFF,
    TRACKING_FINALIZER,
    Backoff,
    backoff_delay,
    build_pod,
    first_pending_indexes,
    format_indexes,
    match_pod_failure_policy,
    parse_indexes,
    pod_failed,
    pods_for_removal,
)

from .batch_fake import EPOCH, FakeCluster, ts, wall

NOW = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------------------------------
# Object factories


def job(name: str = "pi", *, completions: int | None = 1, parallelism: int | None = 1,
        uid: str = "job-uid", status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"completions": completions, "parallelism": parallelism, "backoffLimit": 6,
                         "completionMode": "NonIndexed", "suspend": False,
                         "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
                         "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": uid}},
                                      "spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "main", "image": "busybox"}]}}}
    s.update(spec)
    if s.get("completions") is None:
        s.pop("completions")
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "1",
                         "generation": 1},
            "spec": s, "status": status if status is not None else {"startTime": ts(NOW)}}


def pod(name: str, phase: str = "Running", *, index: int | None = None, ready: bool = False,
        finalizer: bool = True, deleting: bool = False, grace: int = 30, exit_code: int | None = None,
        conditions: list[dict[str, Any]] | None = None, node: str = "n1",
        annotations: dict[str, str] | None = None, finished: dt.datetime = NOW) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}",
                          "creationTimestamp": ts(NOW - dt.timedelta(minutes=5)),
                          "annotations": dict(annotations or {})}
    if index is not None:
        md["annotations"][COMPLETION_INDEX] = str(index)
    if finalizer:
        md["finalizers"] = [TRACKING_FINALIZER]
    if deleting:
        md["deletionTimestamp"] = ts(NOW)
        md["deletionGracePeriodSeconds"] = grace
    if phase in ("Succeeded", "Failed"):
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        state: dict[str, Any] = {"terminated": {"exitCode": code, "finishedAt": ts(finished)}}
    else:
        state = {"running": {}}
    conds = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ts(NOW)}]
    return {"metadata": md, "spec": {"nodeName": node},
            "status": {"phase": phase, "conditions": conds + (conditions or []),
                       "containerStatuses": [{"name": "main", "state": state, "restartCount": 0}]}}


def cond_types(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


def run_sync(j: dict[str, Any], pods: list[dict[str, Any]], **kw: Any) -> tuple[Any, Any, dict[str, Any], bool]:
    """One sync with every pod write succeeding and every finalizer removed."""
    a = assess(Observed(job=j, pods=pods, now=kw.pop("now", NOW), **kw))
    ready_deleted = sum(1 for p in a.delete if any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"]))
    untracked = frozenset(p["metadata"]["uid"] for p in a.delete) if a.untrack_deleted else frozenset()
    t = track(a, IOResult(deleted=len(a.delete), deleted_ready=ready_deleted, created=len(a.create),
                          untracked=untracked))
    removed = {p["metadata"]["uid"] for p in t.remove_finalizers}
    status, done = settle(t, t.tracked_uids - removed, NOW)
    return a, t, status, done


# ---------------------------------------------------------------------------------------
# Pure helpers


@pytest.mark.parametrize(("indexes", "text"), [
    ([], ""), ([0], "0"), ([0, 1], "0,1"), ([0, 1, 2], "0-2"), ([5, 0, 1, 2, 7, 8], "0-2,5,7,8"),
    ([3, 3, 4], "3,4"),
])
def test_format_indexes(indexes, text):
    assert format_indexes(indexes) == text
    assert parse_indexes(text, 100) == set(indexes)


def test_parse_indexes_drops_out_of_range_and_garbage():
    assert parse_indexes("0-3,x,5,9-12", 10) == {0, 1, 2, 3, 5, 9}
    assert parse_indexes("12", 10) == set()


@pytest.mark.parametrize(("failures", "delay"), [
    (0, 0), (1, 10), (2, 20), (3, 40), (4, 80), (5, 160), (6, 320), (7, 360), (20, 360),
])
def test_backoff_delay_doubles_and_caps_at_six_minutes(failures, delay):
    assert backoff_delay(failures) == delay
    assert MAX_POD_FAILURE_BACKOFF == 360


def test_backoff_record_resets_on_success_but_keeps_later_failures():
    t = NOW
    fail_early = pod("a", "Failed", finished=t)
    ok = pod("b", "Succeeded", finished=t + dt.timedelta(seconds=5))
    fail_late = pod("c", "Failed", finished=t + dt.timedelta(seconds=9))
    assert Backoff().updated([], [fail_early]) == Backoff(1, t)
    assert Backoff(3, t).updated([ok], [fail_early]) == Backoff(0, None)
    assert Backoff(3, t).updated([ok], [fail_early, fail_late]) == Backoff(1, t + dt.timedelta(seconds=9))
    assert Backoff(2, t).remaining(t + dt.timedelta(seconds=5)) == 15


@pytest.mark.parametrize(("p", "only_failed", "want"), [
    (pod("a", "Failed"), False, True),
    (pod("a", "Succeeded"), False, False),
    (pod("a", "Running"), False, False),
    (pod("a", "Running", deleting=True), False, True),  # TerminatingOrFailed: counted when marked
    (pod("a", "Running", deleting=True), True, False),  # Failed: only once it stopped
    (pod("a", "Running", deleting=True, grace=0), True, True),  # the node finished deleting it
    (pod("a", "Succeeded", deleting=True), False, False),
])
def test_pod_failed(p, only_failed, want):
    assert pod_failed(p, only_failed) is want


POLICY = {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1, 2]}},
]}


@pytest.mark.parametrize(("p", "action", "counts", "message"), [
    (pod("x", "Failed", exit_code=42), "FailJob", True,
     "Container main for pod default/x failed with exit code 42 matching FailJob rule at index 0"),
    (pod("x", "Failed", exit_code=1, conditions=[{"type": "DisruptionTarget", "status": "True"}]),
     "Ignore", False, None),
    (pod("x", "Failed", exit_code=7), "Count", True, None),
    (pod("x", "Failed", exit_code=1), None, True, None),  # no rule: the default, counted
    (pod("x", "Failed", exit_code=0), None, True, None),  # exit 0 never matches exit-code rules
])
def test_pod_failure_policy(p, action, counts, message):
    m = match_pod_failure_policy(POLICY, p)
    assert (m.action, m.counts, m.message) == (action, counts, message)


def test_pods_for_removal_prefers_unready_then_newest_and_indexed_duplicates():
    j = job(completions=3, parallelism=3, completionMode="Indexed")
    a = pod("ready", ready=True)
    b = pod("unready")
    c = pod("pending", "Pending", node="")
    assert [p["metadata"]["name"] for p in pods_for_removal(job(), [a, b, c], 2)] == ["pending", "unready"]
    dup1, dup2 = pod("i0-a", index=0, ready=True), pod("i0-b", index=0)
    stray = pod("no-index")
    beyond = pod("i7", index=7)
    keep = pod("i1", index=1)
    rm = pods_for_removal(j, [dup1, dup2, stray, beyond, keep], 0)
    assert sorted(p["metadata"]["name"] for p in rm) == ["i0-b", "i7", "no-index"]


def test_first_pending_indexes():
    assert first_pending_indexes(3, 10, {0, 2, 3}) == [1, 4, 5]
    assert first_pending_indexes(5, 3, {1}) == [0, 2]
    assert first_pending_indexes(0, 3, set()) == []


def test_build_pod_for_an_index():
    j = job("work", completions=3, parallelism=3, completionMode="Indexed")
    p = build_pod(j, 2, (1, 0))
    md = p["metadata"]
    assert md["generateName"] == "work-2-"
    assert md["annotations"][COMPLETION_INDEX] == "2" and md["labels"][COMPLETION_INDEX] == "2"
    assert md["annotations"][INDEX_FAILURE_COUNT] == "1"
    assert md["finalizers"] == [TRACKING_FINALIZER]
    assert md["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": "work", "uid": "job-uid",
                                      "controller": True, "blockOwnerDeletion": True}]
    assert p["spec"]["hostname"] == "work-2"
    assert p["spec"]["containers"][0]["env"] == [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    plain = build_pod(job("x" * 70))
    assert plain["metadata"]["generateName"] == ("x" * 70)[:58]
    assert "annotations" not in plain["metadata"] and "hostname" not in plain["spec"]
    long_ix = build_pod(job("y" * 70, completions=20, completionMode="Indexed"), 12)
    assert long_ix["metadata"]["generateName"].endswith("-12-") and len(long_ix["metadata"]["generateName"]) == 58


# ---------------------------------------------------------------------------------------
# One sync, table-driven: how many pods to create or delete


@pytest.mark.parametrize(("desc", "j", "pods", "create", "delete"), [
    ("a new job starts parallelism pods", job(completions=5, parallelism=2), [], 2, 0),
    ("never more than the completions still missing",
     job(completions=5, parallelism=2, status={"startTime": ts(NOW), "succeeded": 4}), [], 1, 0),
    ("running pods count toward parallelism", job(completions=5, parallelism=3), [pod("a"), pod("b")], 1, 0),
    ("parallelism lowered: the surplus goes",
     job(completions=9, parallelism=1), [pod("a", ready=True), pod("b")], 0, 1),
    ("work queue: parallelism while nothing succeeded", job(completions=None, parallelism=3), [], 3, 0),
    ("work queue: after a success nothing new starts",
     job(completions=None, parallelism=3), [pod("a"), pod("b", "Succeeded")], 0, 0),
    ("suspended: every active pod goes", job(completions=3, parallelism=3, suspend=True),
     [pod("a"), pod("b"), pod("c", "Succeeded")], 0, 2),
    ("a terminating pod is replaced at once (TerminatingOrFailed)",
     job(completions=1), [pod("a", deleting=True, ready=True)], 1, 0),
    ("... but not before it stopped with podReplacementPolicy Failed",
     job(completions=1, podReplacementPolicy="Failed"), [pod("a", deleting=True, ready=True)], 0, 0),
])
def test_manage_counts(desc, j, pods, create, delete):
    a = assess(Observed(job=j, pods=pods, now=NOW))
    assert (len(a.create), len(a.delete)) == (create, delete), desc


def test_unseen_creations_block_new_pods():
    a = assess(Observed(job=job(completions=3, parallelism=3), pods=[], now=NOW, satisfied=False))
    assert a.create == [] and not a.manage_called


def test_indexed_job_creates_the_missing_indexes():
    j = job(completions=5, parallelism=3, completionMode="Indexed",
            status={"startTime": ts(NOW), "completedIndexes": "0", "succeeded": 1})
    a = assess(Observed(job=j, pods=[pod("p2", index=2)], now=NOW))
    assert a.create == [1, 3]


def test_failed_pod_waits_for_the_backoff():
    j = job(completions=1)
    failed = pod("a", "Failed", finished=NOW - dt.timedelta(seconds=4))
    a = assess(Observed(job=j, pods=[failed], now=NOW))
    assert a.create == [] and a.requeue_after == pytest.approx(6)
    later = assess(Observed(job=j, pods=[failed], now=NOW + dt.timedelta(seconds=10)))
    assert later.create == [None]


def test_success_goes_through_uncounted_then_counters_and_completes():
    j = job(completions=1)
    done = pod("a", "Succeeded")
    a, t, status, finished = run_sync(j, [done])
    assert t.status["uncountedTerminatedPods"]["succeeded"] == ["uid-a"]
    assert [c["type"] for c in t.status["conditions"]] == ["SuccessCriteriaMet"]
    assert [p["metadata"]["name"] for p in t.remove_finalizers] == ["a"]
    assert finished and status["succeeded"] == 1 and not status["uncountedTerminatedPods"]["succeeded"]
    assert cond_types(status) == {"SuccessCriteriaMet": "True", "Complete": "True"}
    complete = next(c for c in status["conditions"] if c["type"] == "Complete")
    assert (complete["reason"], complete["message"]) == ("CompletionsReached",
                                                         "Reached expected number of succeeded pods")
    assert status["completionTime"] == ts(NOW)


def test_a_finalizer_that_could_not_be_removed_keeps_the_pod_uncounted():
    a = assess(Observed(job=job(completions=1), pods=[pod("a", "Succeeded")], now=NOW))
    t = track(a, IOResult())
    status, finished = settle(t, t.tracked_uids, NOW)  # nothing removed
    assert not finished and status["uncountedTerminatedPods"]["succeeded"] == ["uid-a"]
    assert not status.get("succeeded")


def test_uncounted_pod_whose_finalizer_is_gone_is_counted_once():
    j = job(completions=2, parallelism=2,
            status={"startTime": ts(NOW), "uncountedTerminatedPods": {"succeeded": ["uid-a"]}})
    gone = pod("a", "Succeeded", finalizer=False)
    a, t, status, _ = run_sync(j, [gone, pod("b")])
    assert status["succeeded"] == 1 and not status["uncountedTerminatedPods"].get("succeeded")
    assert a.create == []  # one succeeded, one running: nothing missing


def test_backoff_limit_exceeded_fails_after_pods_stop():
    j = job(completions=3, parallelism=2, backoffLimit=1, status={"startTime": ts(NOW), "failed": 1})
    running = pod("r", ready=True)
    a, t, status, finished = run_sync(j, [pod("f", "Failed"), running])
    assert a.finished["reason"] == "BackoffLimitExceeded"
    assert [p["metadata"]["name"] for p in a.delete] == ["r"] and not a.untrack_deleted
    # The stopped pod is counted as failed too; Failed waits for it to terminate.
    assert cond_types(status) == {"FailureTarget": "True"} and not finished
    assert status["failed"] == 3 and status["terminating"] == 1 and status["active"] == 0
    # Next sync: the pod is gone, the Job fails.
    j2 = job(completions=3, parallelism=2, backoffLimit=1, status=status)
    _, _, status2, finished2 = run_sync(j2, [])
    assert finished2 and cond_types(status2) == {"FailureTarget": "True", "Failed": "True"}
    failed_cond = next(c for c in status2["conditions"] if c["type"] == "Failed")
    assert failed_cond["message"] == "Job has reached the specified backoff limit"
    assert "completionTime" not in status2


def test_active_deadline():
    j = job(completions=1, activeDeadlineSeconds=30)
    a = assess(Observed(job=j, pods=[pod("a")], now=NOW + dt.timedelta(seconds=10)))
    assert a.finished is None and a.requeue_after == pytest.approx(20)
    a = assess(Observed(job=j, pods=[pod("a")], now=NOW + dt.timedelta(seconds=30)))
    assert a.finished["reason"] == "DeadlineExceeded"


def test_suspend_then_resume_restarts_the_deadline_clock():
    j = job(completions=2, parallelism=2, suspend=True)
    a, t, status, _ = run_sync(j, [pod("a"), pod("b")])
    assert a.untrack_deleted and len(a.delete) == 2
    assert cond_types(status) == {"Suspended": "True"} and ("Normal", "Suspended", "Job suspended") in t.events
    assert not status["uncountedTerminatedPods"].get("failed")  # stopped by us: not failures
    resumed = job(completions=2, parallelism=2, status=status)
    later = NOW + dt.timedelta(minutes=3)
    a2, t2, status2, _ = run_sync(resumed, [], now=later)
    assert len(a2.create) == 2 and cond_types(status2) == {"Suspended": "False"}
    assert status2["startTime"] == ts(later)


def test_created_suspended_has_no_start_time():
    a, _, status, _ = run_sync(job(suspend=True, status={}), [])
    assert "startTime" not in status and cond_types(status) == {"Suspended": "True"}


def test_pod_failure_policy_fail_job_and_ignore():
    policy = {"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}
    j = job(completions=2, parallelism=2, backoffLimit=0, podFailurePolicy=policy,
            podReplacementPolicy="Failed")
    evicted = pod("e", "Failed", conditions=[{"type": "DisruptionTarget", "status": "True"}])
    a, t, status, _ = run_sync(j, [evicted, pod("r")])
    # Ignored: not counted (backoffLimit 0 is not exceeded), replaced after the back-off.
    assert a.finished is None and a.requeue_after == pytest.approx(10)
    assert not status.get("failed") and [p["metadata"]["name"] for p in t.remove_finalizers] == ["e"]
    a, t, status, finished = run_sync(j, [pod("x", "Failed", exit_code=42)])
    assert a.finished["reason"] == "PodFailurePolicy"
    assert finished and next(c for c in status["conditions"] if c["type"] == "Failed")["message"] == \
        "Container main for pod default/x failed with exit code 42 matching FailJob rule at index 0"


def test_backoff_limit_per_index():
    j = job(completions=3, parallelism=3, completionMode="Indexed", backoffLimitPerIndex=1,
            backoffLimit=2147483647)
    first = pod("i1-a", "Failed", index=1, annotations={INDEX_FAILURE_COUNT: "0"},
                finished=NOW - dt.timedelta(seconds=30))
    a, t, status, _ = run_sync(j, [pod("i0", index=0), first, pod("i2", index=2)])
    # Index 1 may retry once; its failed pod keeps the finalizer until the replacement exists.
    assert a.create == [1] and a.index_failures == {1: (1, 0)}
    assert "i1-a" not in [p["metadata"]["name"] for p in t.remove_finalizers]
    assert status["failedIndexes"] == ""
    second = pod("i1-b", "Failed", index=1, annotations={INDEX_FAILURE_COUNT: "1"})
    a, t, status, _ = run_sync(j, [pod("i0", "Succeeded", index=0), first, second, pod("i2", index=2)])
    assert status["failedIndexes"] == "1" and status["completedIndexes"] == "0"
    assert a.create == [] and a.finished is None
    a, t, status, finished = run_sync(
        job(completions=3, parallelism=3, completionMode="Indexed", backoffLimitPerIndex=1,
            backoffLimit=2147483647, status=status), [pod("i2", "Succeeded", index=2)])
    assert a.finished["reason"] == "FailedIndexes" and finished
    assert status["completedIndexes"] == "0,2"


def test_max_failed_indexes():
    j = job(completions=4, parallelism=4, completionMode="Indexed", backoffLimitPerIndex=0,
            maxFailedIndexes=0, backoffLimit=2147483647)
    a = assess(Observed(job=j, pods=[pod("i3", "Failed", index=3)], now=NOW))
    assert a.finished["reason"] == "MaxFailedIndexesExceeded"


def test_restart_counts_exceed_backoff_limit_with_on_failure():
    j = job(backoffLimit=2)
    j["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    p = pod("a")
    p["status"]["containerStatuses"][0]["restartCount"] = 2
    assert assess(Observed(job=j, pods=[p], now=NOW)).finished["reason"] == "BackoffLimitExceeded"


def test_ttl_remaining():
    finished = job(ttlSecondsAfterFinished=60, status={"conditions": [
        {"type": "Complete", "status": "True", "lastTransitionTime": ts(NOW)}]})
    assert ttl_remaining(finished, NOW + dt.timedelta(seconds=20)) == 40
    assert ttl_remaining(job(ttlSecondsAfterFinished=60), NOW) is None


# ---------------------------------------------------------------------------------------
# The controller under MockClock


def new_job(name: str, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"template": {"spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "main", "image": "busybox"}]}}}
    s.update(spec)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": s}


@asynccontextmanager
async def controller(fake: FakeCluster, **kw: Any) -> AsyncIterator[JobController]:
    c = JobController(now=wall, **kw)
    c.setup(fake.ctx)
    fake.start()
    async with trio.open_nursery() as n:
        n.start_soon(c.run, fake.ctx)
        yield c
        n.cancel_scope.cancel()


async def until(what: str, pred: Callable[[], Any], timeout: float = 600) -> Any:
    with trio.move_on_after(timeout):
        while True:
            got = pred()
            if got:
                return got
            await trio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def live(fake: FakeCluster, job_name: str) -> list[dict[str, Any]]:
    return [p for p in fake.pods() if p["metadata"]["name"].startswith(job_name + "-")
            and p["status"].get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")]


def condition(fake: FakeCluster, name: str, ctype: str) -> dict[str, Any] | None:
    j = fake.job(name) or {}
    return next((c for c in (j.get("status") or {}).get("conditions") or []
                 if c["type"] == ctype and c["status"] == "True"), None)


async def test_completions_five_parallelism_two(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("five", completions=5, parallelism=2))
    most = 0
    async with controller(fake):
        while not condition(fake, "five", "Complete"):
            running = live(fake, "five")
            most = max(most, len(running))
            for p in running:  # each pod runs a little, then succeeds
                fake.set_pod_phase("default", p["metadata"]["name"], "Succeeded")
            await trio.sleep(0.5)
            assert trio.current_time() < 300, "the Job did not complete"
    pods = fake.pods()
    assert most == 2
    assert len(pods) == 5 and all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert all(TRACKING_FINALIZER not in (p["metadata"].get("finalizers") or []) for p in pods)
    status = fake.job("five")["status"]
    assert status["succeeded"] == 5 and not status.get("failed") and not status.get("active")
    assert fake.events.reasons("five").count("SuccessfulCreate") == 5
    assert fake.events.reasons("five")[-1] == "Completed"


async def test_failed_pods_are_replaced_with_exponential_backoff(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("flaky", backoffLimit=3))
    created: list[float] = []
    failed_at: list[float] = []
    async with controller(fake):
        seen: set[str] = set()
        while not condition(fake, "flaky", "Failed"):
            for p in live(fake, "flaky"):
                name = p["metadata"]["name"]
                if name not in seen:
                    seen.add(name)
                    created.append(trio.current_time())
                    await trio.sleep_until(int(trio.current_time()) + 2)  # fail on a whole second
                    fake.set_pod_phase("default", name, "Failed", exit_code=1)
                    failed_at.append(trio.current_time())
            await trio.sleep(0.1)
            assert trio.current_time() < 1000
    # backoffLimit 3: four pods, each replacement 10 s, 20 s, 40 s after the failure.
    assert len(created) == 4
    gaps = [c - f for f, c in zip(failed_at, created[1:], strict=False)]
    for gap, want in zip(gaps, (10, 20, 40), strict=True):
        assert want <= gap < want + 1.5, gaps
    status = fake.job("flaky")["status"]
    assert status["failed"] == 4
    assert condition(fake, "flaky", "Failed")["reason"] == "BackoffLimitExceeded"
    assert "BackoffLimitExceeded" in fake.events.reasons("flaky")


async def test_active_deadline_stops_pods_and_fails(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("slow", activeDeadlineSeconds=30, parallelism=2, completions=4))
    async with controller(fake):
        await until("two pods", lambda: len(live(fake, "slow")) == 2)
        failed = await until("Failed", lambda: condition(fake, "slow", "Failed"))
        failed_at = trio.current_time()
    assert 30 <= failed_at < 32
    assert failed["reason"] == "DeadlineExceeded"
    assert fake.pods() == []  # stopped, counted, finalizers gone
    status = fake.job("slow")["status"]
    assert status["failed"] == 2 and cond_types(status)["FailureTarget"] == "True"
    assert ("Warning", "DeadlineExceeded") in [(t, r) for n, t, r, _ in fake.events.events if n == "slow"]


async def test_ttl_after_finished_deletes_the_job_in_the_background(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("short", ttlSecondsAfterFinished=60))
    async with controller(fake):
        p = (await until("a pod", lambda: live(fake, "short")))[0]
        fake.set_pod_phase("default", p["metadata"]["name"], "Succeeded")
        await until("Complete", lambda: condition(fake, "short", "Complete"))
        done = trio.current_time()
        await until("the Job deleted", lambda: fake.job("short") is None)
    assert 59 <= trio.current_time() - done < 62
    assert fake.last_delete_options["propagationPolicy"] == "Background"


async def test_suspend_and_resume(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("pause", completions=3, parallelism=3))
    async with controller(fake):
        await until("three pods", lambda: len(live(fake, "pause")) == 3)
        j = fake.job("pause")
        j["spec"]["suspend"] = True
        fake.update("batch/v1", "jobs", j)
        await until("suspended", lambda: condition(fake, "pause", "Suspended") and not fake.pods())
        status = fake.job("pause")["status"]
        assert not status.get("failed") and not status.get("active")
        j = fake.job("pause")
        j["spec"]["suspend"] = False
        fake.update("batch/v1", "jobs", j)
        await until("resumed", lambda: len(live(fake, "pause")) == 3)
    assert "Suspended" in fake.events.reasons("pause") and "Resumed" in fake.events.reasons("pause")


async def test_indexed_job_runs_each_index_once(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("idx", completions=4, parallelism=2, completionMode="Indexed"))
    seen: list[int] = []
    async with controller(fake):
        while not condition(fake, "idx", "Complete"):
            for p in live(fake, "idx"):
                ix = int(p["metadata"]["annotations"][COMPLETION_INDEX])
                assert p["metadata"]["name"].startswith(f"idx-{ix}-")
                seen.append(ix)
                fake.set_pod_phase("default", p["metadata"]["name"], "Succeeded")
            await trio.sleep(0.3)
            assert trio.current_time() < 300
    assert sorted(seen) == [0, 1, 2, 3]
    status = fake.job("idx")["status"]
    assert status["completedIndexes"] == "0-3" and status["succeeded"] == 4


async def test_a_pod_deleted_before_it_was_counted_still_counts(autojump_clock):
    """The tracking finalizer: a succeeded pod deleted at once is counted anyway."""
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("keep", completions=1))
    async with controller(fake, batch_period=30.0):  # make the controller slow to look
        p = (await until("a pod", lambda: live(fake, "keep")))[0]
        name = p["metadata"]["name"]
        fake.set_pod_phase("default", name, "Succeeded")
        await fake.delete("v1", "pods", name, "default")
        held = fake.get("v1", "pods", "default", name)
        assert held is not None and held["metadata"]["deletionTimestamp"]  # held by the finalizer
        await until("Complete", lambda: condition(fake, "keep", "Complete"))
    assert fake.job("keep")["status"]["succeeded"] == 1
    assert fake.pods() == []  # counted, released, gone


async def test_stale_status_write_is_refused_and_retried(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("race", completions=1))
    async with controller(fake):
        p = (await until("a pod", lambda: live(fake, "race")))[0]
        # Someone else writes the Job between our read and our write: 409, retry.
        from fleet.client import ApiException
        fake.fail[("replace", "jobs")] = ApiException({"code": 409, "message": "conflict"}, 409)
        fake.set_pod_phase("default", p["metadata"]["name"], "Succeeded")
        await until("Complete", lambda: condition(fake, "race", "Complete"))
    assert fake.job("race")["status"]["succeeded"] == 1


async def test_per_index_backoff_limit_through_the_loop(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("per", completions=2, parallelism=2, completionMode="Indexed",
                                         backoffLimitPerIndex=1))
    attempts: dict[int, int] = {0: 0, 1: 0}
    async with controller(fake):
        while not condition(fake, "per", "Failed"):
            for p in live(fake, "per"):
                ix = int(p["metadata"]["annotations"][COMPLETION_INDEX])
                attempts[ix] += 1
                # Index 0 succeeds; index 1 always fails.
                fake.set_pod_phase("default", p["metadata"]["name"], "Succeeded" if ix == 0 else "Failed")
            await trio.sleep(0.5)
            assert trio.current_time() < 300
    status = fake.job("per")["status"]
    assert attempts == {0: 1, 1: 2}
    assert status["failedIndexes"] == "1" and status["completedIndexes"] == "0"
    assert condition(fake, "per", "Failed")["reason"] == "FailedIndexes"


async def test_orphaned_pods_lose_the_tracking_finalizer(autojump_clock):
    fake = FakeCluster()
    fake.add("batch/v1", "jobs", new_job("gone", completions=1))
    async with controller(fake):
        p = (await until("a pod", lambda: live(fake, "gone")))[0]
        await fake.delete("batch/v1", "jobs", "gone", "default")
        await until("finalizer released", lambda: TRACKING_FINALIZER not in (
            fake.get("v1", "pods", "default", p["metadata"]["name"])["metadata"].get("finalizers") or []))


def test_default_now_is_wall_clock():
    assert JobController().now().tzinfo is not None
    assert EPOCH.tzinfo is dt.UTC
    assert copy.deepcopy(job()) == job()


async def test_manual_selector_adopts_matching_orphans_with_the_tracking_finalizer(autojump_clock):
    fake = FakeCluster()
    labels = {"team": "x"}

    def stray(name: str, **md: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": dict(labels), **md},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Running"}}

    other = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "uid-rs", "controller": True}
    fake.add("v1", "pods", stray("orphan"))
    fake.add("v1", "pods", stray("taken", ownerReferences=[other]))
    fake.add("batch/v1", "jobs", new_job("manual", completions=1, parallelism=1, manualSelector=True,
                                         selector={"matchLabels": labels},
                                         template={"metadata": {"labels": labels},
                                                   "spec": {"restartPolicy": "Never", "containers": [
                                                       {"name": "main", "image": "busybox"}]}}))
    job_uid = fake.job("manual")["metadata"]["uid"]

    def adopted() -> dict[str, Any] | None:
        p = fake.get("v1", "pods", "default", "orphan")
        refs = p["metadata"].get("ownerReferences") or []
        return p if any(r.get("uid") == job_uid and r.get("controller") for r in refs) else None

    async with controller(fake):
        p = await until("the orphan adopted", adopted)
        assert p["metadata"]["ownerReferences"] == [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "manual", "uid": job_uid,
             "controller": True, "blockOwnerDeletion": True}]
        assert TRACKING_FINALIZER in p["metadata"]["finalizers"]
        fake.set_pod_phase("default", "orphan", "Succeeded")
        await until("complete", lambda: condition(fake, "manual", "Complete"))
    # The adopted pod was the Job's one pod; the other controller's pod was left alone.
    assert sorted(p["metadata"]["name"] for p in fake.pods()) == ["orphan", "taken"]
    assert fake.get("v1", "pods", "default", "taken")["metadata"]["ownerReferences"] == [other]
