"""Deployments and ReplicaSets driven by real kubectl, on simulated nodes.

One `fleet server --no-agent` and an in-process simulator (`SimThread`, 6 nodes,
pods Running and Ready 0.2 s after binding) are shared by the module; each test
works in its own namespace.  Everything a user would do goes through kubectl:
create, scale (the scale subresource), `rollout status | history | undo | pause |
resume | restart`, `set image`.  The progress-deadline test makes the new pods
unschedulable (a nodeSelector no node has), which the simulator can express and
which stalls a rollout the same way an image that cannot be pulled does (the real
agent's version is in test_deployments_agent.py).

The restart test has a server of its own: it is killed with SIGKILL in the middle of
a rollout and started again on the same data directory; the rollout must finish
with no ReplicaSet ever having created a pod twice.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import KUBECTL, FleetServer, ServerFactory, _make_base, run_kubectl
from tests.e2e.helpers import wait_until
from tests.integration.test_scheduling_sim import SimThread

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

NODES = 6
APPS = "/apis/apps/v1"


def start_sim(srv: FleetServer, nodes: int = NODES, start_delay: float = 0.2) -> SimThread:
    sim = SimThread(srv)
    sim.cfg.count = nodes
    sim.cfg.start_delay = start_delay
    sim.start()
    with srv.client() as c:
        wait_until(lambda: sum(
            1 for n in c.get("/api/v1/nodes").json()["items"]
            if any(x["type"] == "Ready" and x["status"] == "True"
                   for x in n["status"].get("conditions", []))) == nodes,
            timeout=60, what=f"{nodes} Ready simulated nodes")
    return sim


@pytest.fixture(scope="module")
def cluster() -> Iterator[FleetServer]:
    base = _make_base("fleet-deploy-sim-")
    factory = ServerFactory(base)
    sim: SimThread | None = None
    try:
        srv = factory.start()
        sim = start_sim(srv)
        yield srv
    finally:
        if sim is not None:
            sim.stop()
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.fixture
def ns(cluster: FleetServer) -> Iterator[str]:
    name = f"dep-{uuid.uuid4().hex[:6]}"
    with cluster.client() as c:
        r = c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": name}})
        assert r.status_code == 201, r.text
    yield name
    with cluster.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


def kubectl(srv: FleetServer, *args: str, input: str | None = None, timeout: float = 120,
            ok: bool = True) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=timeout)
    if ok:
        assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
        return out
    assert rc != 0, f"kubectl {' '.join(args)} should have failed\n{out}"
    return out + err


def deployment_yaml(name: str, ns: str, *, replicas: int = 3, image: str = "nginx:1",
                    strategy: dict[str, Any] | None = None, pds: int | None = None,
                    min_ready: int = 0, extra: dict[str, Any] | None = None) -> str:
    spec: dict[str, Any] = {
        "replicas": replicas, "selector": {"matchLabels": {"app": name}},
        "minReadySeconds": min_ready,
        "strategy": strategy or {"type": "RollingUpdate",
                                 "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "web", "image": image}],
                              "terminationGracePeriodSeconds": 0}},
    }
    if pds is not None:
        spec["progressDeadlineSeconds"] = pds
    spec.update(extra or {})
    return json.dumps({"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": name, "namespace": ns}, "spec": spec})


def get(srv: FleetServer, path: str) -> dict[str, Any]:
    with srv.client() as c:
        r = c.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def replicasets(srv: FleetServer, ns: str) -> list[dict[str, Any]]:
    return get(srv, f"{APPS}/namespaces/{ns}/replicasets")["items"]


def pods(srv: FleetServer, ns: str) -> list[dict[str, Any]]:
    return get(srv, f"/api/v1/namespaces/{ns}/pods")["items"]


def ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in p.get("status", {}).get("conditions", []))


def image_of(obj: dict[str, Any]) -> str:
    return obj["spec"]["template"]["spec"]["containers"][0]["image"]


def rs_sizes(srv: FleetServer, ns: str) -> dict[str, int]:
    return {image_of(rs): rs["spec"]["replicas"] for rs in replicasets(srv, ns)}


# ---------------------------------------------------------------------------------------


def test_create_scale_update_history_undo(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    kubectl(srv, "apply", "-f", "-", input=deployment_yaml("web", ns))
    out = kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=90s")
    assert 'deployment "web" successfully rolled out' in out

    (rs,) = replicasets(srv, ns)
    h = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"web-{h}"
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", "pod-template-hash": h}
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    ps = pods(srv, ns)
    assert len(ps) == 3 and all(ready(p) for p in ps)
    for p in ps:
        assert p["metadata"]["name"].startswith(f"web-{h}-") and len(p["metadata"]["name"]) == len(f"web-{h}-") + 5
        ref = p["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["controller"], ref["blockOwnerDeletion"]) == \
            ("ReplicaSet", rs["metadata"]["name"], True, True)

    # kubectl scale goes through the scale subresource.
    kubectl(srv, "-n", ns, "scale", "deployment/web", "--replicas=5")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=90s")
    d = get(srv, f"{APPS}/namespaces/{ns}/deployments/web")
    st = d["status"]
    assert (st["replicas"], st["updatedReplicas"], st["readyReplicas"], st["availableReplicas"]) == \
        (5, 5, 5, 5)
    assert st["observedGeneration"] == d["metadata"]["generation"]
    assert "unavailableReplicas" not in st
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"

    kubectl(srv, "-n", ns, "annotate", "deployment/web", "kubernetes.io/change-cause=to v2")
    kubectl(srv, "-n", ns, "set", "image", "deployment/web", "web=nginx:2")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")
    assert rs_sizes(srv, ns) == {"nginx:1": 0, "nginx:2": 5}
    assert {p["spec"]["containers"][0]["image"]
            for p in pods(srv, ns) if not p["metadata"].get("deletionTimestamp")} == {"nginx:2"}
    history = kubectl(srv, "-n", ns, "rollout", "history", "deployment/web")
    lines = [ln.split() for ln in history.splitlines()[2:] if ln.strip()]
    assert [ln[0] for ln in lines] == ["1", "2"], history
    assert "to v2" in history

    out = kubectl(srv, "-n", ns, "rollout", "undo", "deployment/web")
    assert "rolled back" in out
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")
    d = get(srv, f"{APPS}/namespaces/{ns}/deployments/web")
    assert image_of(d) == "nginx:1"
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"
    assert rs_sizes(srv, ns) == {"nginx:1": 5, "nginx:2": 0}  # the old ReplicaSet came back
    v1 = next(rs for rs in replicasets(srv, ns) if image_of(rs) == "nginx:1")
    assert v1["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"
    assert v1["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"] == "1"
    history = kubectl(srv, "-n", ns, "rollout", "history", "deployment/web")
    assert [ln.split()[0] for ln in history.splitlines()[2:] if ln.strip()] == ["2", "3"], history

    kubectl(srv, "-n", ns, "rollout", "undo", "deployment/web", "--to-revision=2")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/web", "--timeout=120s")
    assert image_of(get(srv, f"{APPS}/namespaces/{ns}/deployments/web")) == "nginx:2"
    out = kubectl(srv, "-n", ns, "rollout", "history", "deployment/web", "--revision=4")
    assert "nginx:2" in out

    # kubectl describe shows what the controller did.
    out = kubectl(srv, "-n", ns, "describe", "deployment/web")
    assert "ScalingReplicaSet" in out and "Scaled up replica set web-" in out


def test_pause_resume_restart(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    kubectl(srv, "apply", "-f", "-", input=deployment_yaml("app", ns, replicas=2))
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/app", "--timeout=90s")
    kubectl(srv, "-n", ns, "rollout", "pause", "deployment/app")
    kubectl(srv, "-n", ns, "set", "image", "deployment/app", "web=nginx:paused")

    def paused_observed() -> dict[str, Any] | None:
        d = get(srv, f"{APPS}/namespaces/{ns}/deployments/app")
        conds = {c["type"]: c for c in d["status"].get("conditions", [])}
        ok = (d["status"].get("observedGeneration") == d["metadata"]["generation"]
              and conds.get("Progressing", {}).get("reason") == "DeploymentPaused")
        return d if ok else None

    d = wait_until(paused_observed, timeout=30, what="the paused Deployment observed")
    assert {c["type"]: c["status"] for c in d["status"]["conditions"]}["Progressing"] == "Unknown"
    time.sleep(1.5)  # a paused Deployment must not start a rollout, even given time
    assert rs_sizes(srv, ns) == {"nginx:1": 2}
    # Scaling still works while paused.
    kubectl(srv, "-n", ns, "scale", "deployment/app", "--replicas=3")
    wait_until(lambda: rs_sizes(srv, ns) == {"nginx:1": 3}, timeout=30, what="paused scale")
    err = kubectl(srv, "-n", ns, "rollout", "restart", "deployment/app", ok=False)
    assert "paused" in err

    kubectl(srv, "-n", ns, "rollout", "resume", "deployment/app")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/app", "--timeout=120s")
    assert rs_sizes(srv, ns) == {"nginx:1": 0, "nginx:paused": 3}

    kubectl(srv, "-n", ns, "rollout", "restart", "deployment/app")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/app", "--timeout=120s")
    rses = replicasets(srv, ns)
    assert len(rses) == 3
    newest = max(rses, key=lambda rs: int(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]))
    assert newest["spec"]["replicas"] == 3
    assert "kubectl.kubernetes.io/restartedAt" in newest["spec"]["template"]["metadata"]["annotations"]
    live = [p for p in pods(srv, ns) if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 3
    assert all(p["metadata"]["labels"]["pod-template-hash"] ==
               newest["metadata"]["labels"]["pod-template-hash"] for p in live)


def test_progress_deadline_exceeded_keeps_old_replicas(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    kubectl(srv, "apply", "-f", "-", input=deployment_yaml("stuck", ns, replicas=3, pds=6,
                                                           strategy=strategy))
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/stuck", "--timeout=90s")
    # New pods that can never start: no node has this label.
    patch = {"spec": {"template": {"spec": {"nodeSelector": {"fleet.test/nowhere": "true"}}}}}
    kubectl(srv, "-n", ns, "patch", "deployment/stuck", "-p", json.dumps(patch))
    t0 = time.monotonic()
    out = kubectl(srv, "-n", ns, "rollout", "status", "deployment/stuck", "--timeout=120s", ok=False)
    assert 'deployment "stuck" exceeded its progress deadline' in out, out
    assert time.monotonic() - t0 >= 4  # not before the deadline (6 s, whole-second stamps)
    d = get(srv, f"{APPS}/namespaces/{ns}/deployments/stuck")
    cond = {c["type"]: c for c in d["status"]["conditions"]}["Progressing"]
    assert (cond["status"], cond["reason"]) == ("False", "ProgressDeadlineExceeded")
    # maxUnavailable 25% of 3 rounds down to 0: all three old pods stay, ready.
    live = [p for p in pods(srv, ns) if not p["metadata"].get("deletionTimestamp")]
    old = [p for p in live if not p["spec"].get("nodeSelector")]
    assert len(old) == 3 and all(ready(p) for p in old)
    assert len(live) == 4  # plus the one surge pod, Pending
    assert d["status"]["availableReplicas"] == 3 and d["status"]["updatedReplicas"] == 1
    # Fixing the template rolls out normally again.
    kubectl(srv, "-n", ns, "rollout", "undo", "deployment/stuck")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/stuck", "--timeout=90s")


def test_recreate_never_overlaps(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    kubectl(srv, "apply", "-f", "-", input=deployment_yaml("rec", ns, replicas=3,
                                                           strategy={"type": "Recreate"}))
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/rec", "--timeout=90s")
    kubectl(srv, "-n", ns, "set", "image", "deployment/rec", "web=nginx:2")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        images = {p["spec"]["containers"][0]["image"] for p in pods(srv, ns)}
        assert images != {"nginx:1", "nginx:2"}, "old and new pods at the same time"
        d = get(srv, f"{APPS}/namespaces/{ns}/deployments/rec")
        st = d["status"]
        if st.get("observedGeneration") == d["metadata"]["generation"] and \
                st.get("updatedReplicas") == 3 and st.get("availableReplicas") == 3 and \
                st.get("replicas") == 3:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"Recreate rollout did not finish: {rs_sizes(srv, ns)}")


def test_replicaset_on_its_own(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "solo", "namespace": ns},
          "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "solo"}},
                   "template": {"metadata": {"labels": {"app": "solo"}},
                                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    kubectl(srv, "apply", "-f", "-", input=json.dumps(rs))

    def status(want: int) -> dict[str, Any] | None:
        st = get(srv, f"{APPS}/namespaces/{ns}/replicasets/solo").get("status") or {}
        return st if st.get("readyReplicas", 0) == want and st.get("replicas") == want else None

    st = wait_until(lambda: status(4), timeout=60, what="4 ready replicas")
    assert st["fullyLabeledReplicas"] == 4 and st["availableReplicas"] == 4
    assert st["observedGeneration"] == 1
    out = kubectl(srv, "-n", ns, "get", "rs", "solo")
    assert out.split("\n")[1].split()[:4] == ["solo", "4", "4", "4"], out
    kubectl(srv, "-n", ns, "scale", "rs/solo", "--replicas=1")
    wait_until(lambda: status(1), timeout=60, what="scaled down to 1")
    wait_until(lambda: len(pods(srv, ns)) == 1, timeout=30, what="the deleted pods gone")
    events = kubectl(srv, "-n", ns, "describe", "rs/solo")
    assert events.count("SuccessfulCreate") >= 1 and "SuccessfulDelete" in events
    assert "Created pod: solo-" in events and "Deleted pod: solo-" in events
    # A matching bare pod is adopted (and, one too many, one pod is deleted).
    kubectl(srv, "-n", ns, "run", "stray", "--image=busybox", "--labels=app=solo")
    wait_until(lambda: status(1) and len(pods(srv, ns)) == 1, timeout=60,
               what="the orphan adopted and the count back to 1")
    kubectl(srv, "-n", ns, "scale", "rs/solo", "--replicas=0")
    wait_until(lambda: not pods(srv, ns), timeout=60, what="no pods")


def test_quota_failure_shows_as_replica_failure(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": ns},
             "spec": {"hard": {"pods": "2"}}}
    kubectl(srv, "apply", "-f", "-", input=json.dumps(quota))
    kubectl(srv, "apply", "-f", "-", input=deployment_yaml("capped", ns, replicas=4))

    def failing() -> dict[str, Any] | None:
        d = get(srv, f"{APPS}/namespaces/{ns}/deployments/capped")
        conds = {c["type"]: c for c in d.get("status", {}).get("conditions", [])}
        return d if "ReplicaFailure" in conds else None

    d = wait_until(failing, timeout=60, what="ReplicaFailure on the Deployment")
    cond = {c["type"]: c for c in d["status"]["conditions"]}["ReplicaFailure"]
    assert (cond["status"], cond["reason"]) == ("True", "FailedCreate")
    assert "exceeded quota: q" in cond["message"], cond
    (rs,) = replicasets(srv, ns)
    rs_cond = {c["type"]: c for c in rs["status"].get("conditions", [])}["ReplicaFailure"]
    assert rs_cond["reason"] == "FailedCreate" and "exceeded quota" in rs_cond["message"]
    assert len(pods(srv, ns)) == 2
    out = kubectl(srv, "-n", ns, "describe", "rs", rs["metadata"]["name"])
    assert "FailedCreate" in out and "exceeded quota" in out
    # Room again: the rest is created (the controller keeps retrying with back-off)
    # and the condition goes away.
    kubectl(srv, "-n", ns, "delete", "resourcequota", "q")
    kubectl(srv, "-n", ns, "rollout", "status", "deployment/capped", "--timeout=120s")
    wait_until(lambda: not failing(), timeout=60, what="ReplicaFailure cleared")


def test_selector_not_matching_template_is_422(cluster: FleetServer, ns: str) -> None:
    body = json.loads(deployment_yaml("bad", ns))
    body["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    with cluster.client() as c:
        r = c.post(f"{APPS}/namespaces/{ns}/deployments", json=body)
    assert r.status_code == 422, r.text
    st = r.json()
    assert st["reason"] == "Invalid" and st["details"]["kind"] == "Deployment"
    assert any(c["field"] == "spec.template.metadata.labels" for c in st["details"]["causes"])
    out = kubectl(cluster, "apply", "-f", "-", input=json.dumps(body), ok=False)
    assert "`selector` does not match template `labels`" in out


# ---------------------------------------------------------------------------------------
# Restart in the middle of a rollout


def _created_per_rs(srv: FleetServer, ns: str, c: httpx.Client) -> dict[str, set[str]]:
    """Pod names each ReplicaSet says it created (SuccessfulCreate events)."""
    out: dict[str, set[str]] = {}
    r = c.get(f"/api/v1/namespaces/{ns}/events")
    for e in r.json().get("items", []) if r.status_code == 200 else []:
        if e.get("reason") == "SuccessfulCreate" and e["involvedObject"]["kind"] == "ReplicaSet":
            out.setdefault(e["involvedObject"]["name"], set()).add(e["message"].rsplit(" ", 1)[-1])
    return out


def test_restart_mid_rollout_creates_no_duplicates(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start()
    sim = start_sim(srv, nodes=4, start_delay=0.3)
    try:
        ns = "restart"
        with srv.client() as c:
            assert c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": ns}}).status_code == 201
        replicas = 10
        kubectl(srv, "apply", "-f", "-", input=deployment_yaml("roll", ns, replicas=replicas,
                                                               min_ready=1))
        kubectl(srv, "-n", ns, "rollout", "status", "deployment/roll", "--timeout=120s")
        kubectl(srv, "-n", ns, "set", "image", "deployment/roll", "web=nginx:2")
        seen: dict[str, set[str]] = {}  # ReplicaSet name -> pod names ever seen owned by it

        def observe() -> dict[str, Any] | None:
            try:
                with srv.client(timeout=5) as c:
                    ps = c.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]
                    d = c.get(f"{APPS}/namespaces/{ns}/deployments/roll").json()
            except (httpx.HTTPError, KeyError, ValueError):
                return None
            for p in ps:
                refs = p["metadata"].get("ownerReferences") or [{}]
                seen.setdefault(refs[0].get("name", "?"), set()).add(p["metadata"]["name"])
            return d

        def mid_rollout() -> bool:
            d = observe()
            return bool(d) and 3 <= (d.get("status") or {}).get("updatedReplicas", 0) < replicas - 2

        wait_until(mid_rollout, timeout=90, interval=0.05, what="the rollout half-way")
        srv.kill()
        srv.start()

        def done() -> bool:
            d = observe()
            if not d:
                return False
            st = d.get("status") or {}
            return (st.get("observedGeneration") == d["metadata"]["generation"]
                    and st.get("updatedReplicas") == replicas and st.get("replicas") == replicas
                    and st.get("availableReplicas") == replicas)

        wait_until(done, timeout=180, interval=0.1, what="the rollout to finish after the restart")
        out = kubectl(srv, "-n", ns, "rollout", "status", "deployment/roll", "--timeout=60s")
        assert "successfully rolled out" in out
        rses = {rs["metadata"]["name"]: rs for rs in replicasets(srv, ns)}
        assert len(rses) == 2
        new = next(n for n, rs in rses.items() if image_of(rs) == "nginx:2")
        old = next(n for n, rs in rses.items() if image_of(rs) == "nginx:1")
        assert rses[new]["spec"]["replicas"] == replicas and rses[old]["spec"]["replicas"] == 0
        live = [p for p in pods(srv, ns) if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == replicas and all(ready(p) for p in live)
        # The new ReplicaSet only ever grew: every pod it created is still there, so it
        # never made one too many (a duplicate would have been created, then deleted).
        with srv.client() as c:
            created = _created_per_rs(srv, ns, c)
        made = seen.get(new, set()) | created.get(new, set())
        assert made == {p["metadata"]["name"] for p in live}, (sorted(made), len(live))
        # The old one created its 10 at the start and nothing after.
        assert len(seen.get(old, set()) | created.get(old, set())) == replicas
        assert all(rs["status"].get("replicas", 0) <= rs["spec"]["replicas"] for rs in rses.values())
    finally:
        sim.stop()
