"""Jobs and CronJobs through a real `fleet server`, on simulated nodes.

One server (`--no-agent`) and one in-process simulator (4 nodes; pods Running 0.2 s
after binding; a pod finishes when its `fleet.dev/simulate-exit-after` annotation
says, with `fleet.dev/simulate-exit-code`) are shared by the module; each test
works in its own namespace.  Everything goes through the API and kubectl, as a
user's Jobs would: the server's scheduler binds the pods, its Job and CronJob
controllers run them.

- a Job with completions 5 and parallelism 2 completes with exactly 5 successful
  pods, never more than 2 active at once (seen through a pod watch);
- an Indexed Job runs each index once;
- failing pods hit backoffLimit and the Job fails (BackoffLimitExceeded);
- ttlSecondsAfterFinished: the finished Job is deleted;
- kubectl: `create job`, `get jobs` columns, `create job --from=cronjob`,
  `wait --for=condition=complete`;
- a CronJob with `*/1 * * * *` fires within a minute and its Job completes (real time).
"""

from __future__ import annotations

import calendar
import json
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ..conftest import KUBECTL, FleetServer, ServerFactory, _make_base, run_kubectl
from .test_scheduling_sim import SimThread, ok, wait_for

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")

EXIT_AFTER = "fleet.dev/simulate-exit-after"
EXIT_CODE = "fleet.dev/simulate-exit-code"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


@pytest.fixture(scope="module")
def cluster() -> Iterator[FleetServer]:
    base = _make_base("fleet-jobs-sim-")
    factory = ServerFactory(base)
    sim: SimThread | None = None
    try:
        srv = factory.start()
        sim = SimThread(srv)
        sim.cfg.count = 4
        sim.start()
        with srv.client() as c:
            wait_for("4 Ready simulated nodes", lambda: sum(
                1 for n in ok(c.get("/api/v1/nodes"))["items"]
                if any(x["type"] == "Ready" and x["status"] == "True"
                       for x in n["status"].get("conditions", []))) == 4, timeout=60)
        yield srv
    finally:
        if sim is not None:
            sim.stop()
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.fixture
def ns(cluster: FleetServer) -> Iterator[str]:
    name = f"jobs-{uuid.uuid4().hex[:6]}"
    with cluster.client() as c:
        ok(c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": name}}), 201)
    yield name
    with cluster.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


def job_body(name: str, *, exit_after: float = 0.5, exit_code: int = 0, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"template": {
        "metadata": {"annotations": {EXIT_AFTER: str(exit_after), EXIT_CODE: str(exit_code)}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}]}}}
    s.update(spec)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": s}


def jobs_path(ns: str, name: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{ns}/jobs" + (f"/{name}" if name else "")


def get_job(c: httpx.Client, ns: str, name: str) -> dict[str, Any]:
    return ok(c.get(jobs_path(ns, name)))


def condition(job: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((x for x in (job.get("status") or {}).get("conditions") or []
                 if x["type"] == ctype and x["status"] == "True"), None)


def job_pods(c: httpx.Client, ns: str, name: str) -> list[dict[str, Any]]:
    return ok(c.get(f"/api/v1/namespaces/{ns}/pods",
                    params={"labelSelector": f"{JOB_NAME_LABEL}={name}"}))["items"]


def kubectl(srv: FleetServer, *args: str, input: str | None = None, timeout: float = 90) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=timeout)
    assert rc == 0, f"kubectl {' '.join(args)}: rc={rc}\n{out}\n{err}"
    return out


class PodWatch:
    """Follows a label-selected pod watch in a thread and remembers the most pods
    ever active at once (not finished, not being deleted)."""

    def __init__(self, srv: FleetServer, ns: str, selector: str) -> None:
        self.srv, self.ns, self.selector = srv, ns, selector
        self.pods: dict[str, dict[str, Any]] = {}
        self.max_active = 0
        self.events = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")

    def __enter__(self) -> PodWatch:
        self._thread.start()
        assert self._ready.wait(30), "the pod watch did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    @staticmethod
    def _active(p: dict[str, Any]) -> bool:
        return (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and \
            not p["metadata"].get("deletionTimestamp")

    def _run(self) -> None:
        rv = ""
        with self.srv.client(timeout=30) as c:
            while not self._stop.is_set():
                params = {"watch": "1", "labelSelector": self.selector, "timeoutSeconds": "2",
                          "allowWatchBookmarks": "true"}
                if rv:
                    params["resourceVersion"] = rv
                try:
                    with c.stream("GET", f"/api/v1/namespaces/{self.ns}/pods", params=params) as r:
                        self._ready.set()
                        for line in r.iter_lines():
                            if not line.strip():
                                continue
                            ev = json.loads(line)
                            obj = ev.get("object") or {}
                            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                            if ev.get("type") == "BOOKMARK":
                                continue
                            uid = obj["metadata"]["uid"]
                            if ev["type"] == "DELETED":
                                self.pods.pop(uid, None)
                            else:
                                self.pods[uid] = obj
                            self.events += 1
                            self.max_active = max(self.max_active,
                                                  sum(1 for p in self.pods.values() if self._active(p)))
                except httpx.HTTPError:
                    time.sleep(0.2)


def test_completions_five_parallelism_two(cluster: FleetServer, ns: str) -> None:
    with cluster.client() as c, PodWatch(cluster, ns, f"{JOB_NAME_LABEL}=five") as watch:
        ok(c.post(jobs_path(ns), json=job_body("five", completions=5, parallelism=2, exit_after=1)), 201)
        job = wait_for("job five Complete", lambda: condition(j := get_job(c, ns, "five"), "Complete") and j,
                       timeout=120, step=0.3)
        time.sleep(1)  # let the watch see the last updates
        pods = job_pods(c, ns, "five")
    assert watch.events > 0
    assert watch.max_active <= 2, watch.max_active
    assert len(pods) == 5 and all(p["status"]["phase"] == "Succeeded" for p in pods), \
        [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
    status = job["status"]
    assert status["succeeded"] == 5 and not status.get("failed") and not status.get("active")
    assert status["startTime"] and status["completionTime"]
    assert condition(job, "SuccessCriteriaMet")["reason"] == "CompletionsReached"
    # Every pod was counted and released: no tracking finalizer left.
    assert all("batch.kubernetes.io/job-tracking" not in (p["metadata"].get("finalizers") or []) for p in pods)
    wait_for("the Completed event in describe", lambda: "Completed" in (
        out := kubectl(cluster, "-n", ns, "describe", "job", "five")) and "SuccessfulCreate" in out, timeout=30)


def test_indexed_job_sees_each_index_once(cluster: FleetServer, ns: str) -> None:
    with cluster.client() as c:
        ok(c.post(jobs_path(ns), json=job_body("idx", completions=4, parallelism=2,
                                               completionMode="Indexed")), 201)
        job = wait_for("job idx Complete", lambda: condition(j := get_job(c, ns, "idx"), "Complete") and j,
                       timeout=120, step=0.3)
        pods = job_pods(c, ns, "idx")
    indexes = sorted(int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]) for p in pods)
    assert indexes == [0, 1, 2, 3]
    for p in pods:
        ix = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert p["metadata"]["name"].startswith(f"idx-{ix}-")
        assert p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == ix
        assert p["spec"]["hostname"] == f"idx-{ix}"
        env = {e["name"]: e for e in p["spec"]["containers"][0]["env"]}
        assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert job["status"]["completedIndexes"] == "0-3" and job["status"]["succeeded"] == 4


def test_failing_pods_hit_the_backoff_limit(cluster: FleetServer, ns: str) -> None:
    with cluster.client() as c:
        ok(c.post(jobs_path(ns), json=job_body("bad", exit_after=0.2, exit_code=3, backoffLimit=1)), 201)
        # The retry waits out the 10 s pod failure back-off.
        job = wait_for("job bad Failed", lambda: condition(j := get_job(c, ns, "bad"), "Failed") and j,
                       timeout=120, step=0.5)
        pods = job_pods(c, ns, "bad")
        # Events are written in the background: wait for the one that says why.
        wait_for("the BackoffLimitExceeded event", lambda: any(
            e["reason"] == "BackoffLimitExceeded" and e["type"] == "Warning"
            for e in ok(c.get(f"/api/v1/namespaces/{ns}/events"))["items"]
            if e["involvedObject"].get("name") == "bad"), timeout=30)
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert condition(job, "Failed")["message"] == "Job has reached the specified backoff limit"
    assert condition(job, "FailureTarget") is not None
    assert job["status"]["failed"] == 2 and len(pods) == 2
    assert all(p["status"]["phase"] == "Failed" for p in pods)
    rc, out, _ = run_kubectl(cluster, "-n", ns, "get", "job", "bad")
    assert rc == 0 and re.search(r"^bad\s+Failed\s+0/1\s", out.splitlines()[1]), out


def test_ttl_after_finished_deletes_the_job(cluster: FleetServer, ns: str) -> None:
    with cluster.client() as c:
        ok(c.post(jobs_path(ns), json=job_body("brief", ttlSecondsAfterFinished=2)), 201)
        wait_for("job brief to finish and be deleted", lambda: c.get(jobs_path(ns, "brief")).status_code == 404,
                 timeout=90, step=0.3)


def test_kubectl_create_job_get_jobs_and_wait(cluster: FleetServer, ns: str) -> None:
    out = kubectl(cluster, "-n", ns, "create", "job", "hello", "--image=busybox", "--", "echo", "hi")
    assert out.strip() == "job.batch/hello created"
    with cluster.client() as c:
        job = get_job(c, ns, "hello")
        uid = job["metadata"]["uid"]
        # The generated selector and template labels, as Kubernetes.
        assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels["batch.kubernetes.io/controller-uid"] == uid and labels["controller-uid"] == uid
        assert labels[JOB_NAME_LABEL] == "hello" and labels["job-name"] == "hello"
        pod = wait_for("hello's pod Running", lambda: [p for p in job_pods(c, ns, "hello")
                                                       if p["status"].get("phase") == "Running"], timeout=60)[0]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
        assert "batch.kubernetes.io/job-tracking" in pod["metadata"]["finalizers"]
    rows = kubectl(cluster, "-n", ns, "get", "jobs").splitlines()
    assert rows[0].split() == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert rows[1].split()[:3] == ["hello", "Running", "0/1"]
    wide = kubectl(cluster, "-n", ns, "get", "jobs", "-o", "wide").splitlines()
    assert wide[0].split() == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE", "CONTAINERS", "IMAGES",
                               "SELECTOR"]
    assert f"batch.kubernetes.io/controller-uid={uid}" in wide[1]

    # A Job from a (suspended) CronJob's template: its pods finish, kubectl wait returns.
    kubectl(cluster, "-n", ns, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "suspend": True,
                 "jobTemplate": {"spec": job_body("x", exit_after=0.5)["spec"]}}}))
    out = kubectl(cluster, "-n", ns, "create", "job", "now", "--from=cronjob/nightly")
    assert out.strip() == "job.batch/now created"
    out = kubectl(cluster, "-n", ns, "wait", "--for=condition=complete", "job/now", "--timeout=90s", timeout=120)
    assert out.strip() == "job.batch/now condition met"
    row = kubectl(cluster, "-n", ns, "get", "job", "now").splitlines()[1].split()
    assert row[:3] == ["now", "Complete", "1/1"]


def test_cronjob_fires_on_a_real_one_minute_schedule(cluster: FleetServer, ns: str) -> None:
    cj = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "minutely"},
          "spec": {"schedule": "*/1 * * * *", "timeZone": "UTC",
                   "jobTemplate": {"spec": job_body("x", exit_after=1)["spec"]}}}
    with cluster.client() as c:
        created = ok(c.post(f"/apis/batch/v1/namespaces/{ns}/cronjobs", json=cj), 201)
        # The next minute boundary is at most 60 s away; the Job then runs ~1 s.
        job = wait_for("a Job from the CronJob to complete", lambda: next((
            j for j in ok(c.get(jobs_path(ns)))["items"] if condition(j, "Complete")), None),
            timeout=130, step=1)
        cron = wait_for("the CronJob's status", lambda: (
            s := ok(c.get(f"/apis/batch/v1/namespaces/{ns}/cronjobs/minutely"))["status"]).get(
            "lastSuccessfulTime") and s, timeout=30)
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("CronJob", "minutely", created["metadata"]["uid"])
    m = re.fullmatch(r"minutely-(\d+)", job["metadata"]["name"])
    assert m, job["metadata"]["name"]
    # Named after its scheduled minute, which is on the minute and recorded.
    scheduled = job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
    minute = calendar.timegm(time.strptime(scheduled, "%Y-%m-%dT%H:%M:%SZ"))
    assert int(m.group(1)) * 60 == minute
    assert cron["lastScheduleTime"] and cron["lastSuccessfulTime"]
    rows = kubectl(cluster, "-n", ns, "get", "cronjobs").splitlines()
    assert rows[0].split()[:6] == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST"]
    assert rows[1].split()[:8] == ["minutely", "*/1", "*", "*", "*", "*", "UTC", "False"]
