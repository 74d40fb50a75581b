"""StatefulSets with kubectl against a real `fleet server` and simulated nodes.

One server (no built-in agent) and three simulated nodes are shared by the
module; each test works in its own namespace, with a `ClaimBinder` playing the
storage provisioner (simulated nodes run no storage driver, and the scheduler — as
Kubernetes' — waits for claims to bind; StatefulSets with real volumes are
tests/e2e/test_storage.py's) and a `PodWatch` recording the order of pod events.

- a StatefulSet of 3 starts its pods in order 0, 1, 2, each only after the
  previous one is Running and Ready; each pod keeps its claim (same object,
  same uid) when it is deleted and comes back, and across `kubectl rollout
  restart`, which replaces the pods from the highest ordinal down;
- scaling down removes the highest ordinals first and keeps their claims, and
  scaling up again mounts the very same claims;
- a rolling update with a partition updates only the ordinals at or above it,
  a pod below it is re-created at the old revision, lowering the partition
  finishes the rollout, and `kubectl rollout undo` rolls back;
- persistentVolumeClaimRetentionPolicy Delete/Delete hands the claims to the
  set, and a scaled-away ordinal's claim to its pod, and the garbage collector
  deletes each claim with its owner.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import KUBECTL, FleetServer, ServerFactory, _make_base, create_namespace
from tests.e2e.helpers import wait_until
from tests.e2e.simnodes import ClaimBinder, PodWatch, SimNodes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

NODES = 3
TIMEOUT = 180.0  # generous: the machine is shared and slow under load


@pytest.fixture(scope="module")
def cluster() -> Iterator[FleetServer]:
    base = _make_base("fleet-sts-")
    factory = ServerFactory(base)
    sim: SimNodes | None = None
    try:
        srv = factory.start()
        sim = SimNodes(srv, count=NODES, prefix="stsn").start()
        wait_until(lambda: len(_ready_nodes(srv)) == NODES, timeout=60, what="simulated nodes Ready")
        yield srv
    finally:
        if sim is not None:
            sim.stop()
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


def _ready_nodes(srv: FleetServer) -> list[str]:
    with srv.client() as c:
        items = c.get("/api/v1/nodes").json().get("items") or []
    return [n["metadata"]["name"] for n in items
            if any(x["type"] == "Ready" and x["status"] == "True" for x in n["status"].get("conditions", []))]


@pytest.fixture
def ns(cluster: FleetServer) -> Iterator[str]:
    name = f"sts-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, name)
    binder = ClaimBinder(cluster, name).start()
    try:
        yield name
    finally:
        binder.stop()


def kubectl(srv: FleetServer, *args: str, input: str | None = None, timeout: float = TIMEOUT) -> str:
    rc, out, err = srv.kubectl(*args, input=input, timeout=timeout + 30)
    assert rc == 0, f"kubectl {' '.join(args)} failed ({rc}): {err}{out}"
    return out


def get_json(srv: FleetServer, *args: str) -> Any:
    return json.loads(kubectl(srv, "get", *args, "-o", "json"))


def statefulset(name: str, ns: str, *, replicas: int = 3, claims: bool = True, image: str = "img:v1",
                **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image,
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}] if claims else []}]}},
        **spec,
    }
    if claims:
        body["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": ns},
            "spec": body}


def headless_service(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": "None", "selector": {"app": name}, "ports": [{"port": 80, "name": "web"}]}}


def apply(srv: FleetServer, *objs: dict[str, Any]) -> None:
    # One document each (a multi-document stream; a `kind: List` works as well since /openapi/v2).
    kubectl(srv, "apply", "-f", "-", input=yaml.safe_dump_all(objs))


def rollout(srv: FleetServer, ns: str, what: str) -> str:
    return kubectl(srv, "rollout", "status", what, "-n", ns, f"--timeout={int(TIMEOUT)}s")


def pods_by_name(srv: FleetServer, ns: str, app: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in get_json(srv, "pods", "-n", ns, "-l", f"app={app}")["items"]
            if not p["metadata"].get("deletionTimestamp")}


def claim_uids(srv: FleetServer, ns: str) -> dict[str, str]:
    return {c["metadata"]["name"]: c["metadata"]["uid"] for c in get_json(srv, "pvc", "-n", ns)["items"]}


def all_ready(srv: FleetServer, ns: str, app: str, names: list[str]) -> dict[str, dict[str, Any]] | None:
    pods = pods_by_name(srv, ns, app)
    if sorted(pods) == sorted(names) and all(PodWatch.ready(p) for p in pods.values()):
        return pods
    return None


def test_ordered_start_and_claims_survive_pod_deletion_and_restart(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    watch = PodWatch(srv, ns, "app=web").start()
    try:
        apply(srv, headless_service("web", ns), statefulset("web", ns))
        rollout(srv, ns, "statefulset/web")

        # In order: each pod is created only once the one before it is Running and Ready.
        assert watch.first_ready() == ["web-0", "web-1", "web-2"]
        events = watch.snapshot()
        for prev, nxt in (("web-0", "web-1"), ("web-1", "web-2")):
            created = next(i for i, (t, p) in enumerate(events) if p["metadata"]["name"] == nxt)
            assert any(p["metadata"]["name"] == prev and PodWatch.ready(p) for _, p in events[:created]), \
                f"{nxt} was created before {prev} was ready"

        pods = pods_by_name(srv, ns, "web")
        for i in range(3):
            pod = pods[f"web-{i}"]
            assert pod["spec"]["hostname"] == f"web-{i}" and pod["spec"]["subdomain"] == "web"
            assert pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == f"web-{i}"
            assert pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == str(i)
            vols = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert vols["data"]["persistentVolumeClaim"]["claimName"] == f"data-web-{i}"
        claims = claim_uids(srv, ns)
        assert sorted(claims) == ["data-web-0", "data-web-1", "data-web-2"]
        table = kubectl(srv, "get", "pvc", "-n", ns)
        assert table.splitlines()[0].split()[:6] == ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS", "MODES"]
        sts = get_json(srv, "statefulset", "web", "-n", ns)
        assert sts["status"]["readyReplicas"] == 3 and sts["status"]["currentRevision"] == \
            sts["status"]["updateRevision"]

        # Pod 1 deleted: it comes back under the same name, with the same claim object.
        old_uid = pods["web-1"]["metadata"]["uid"]
        # --wait=false: the set re-creates web-1 within milliseconds here (simulated nodes
        # need no grace period), and kubectl's own wait then watches the new pod for a
        # DELETED event that never comes.  The test waits for the new uid itself.
        kubectl(srv, "delete", "pod", "web-1", "-n", ns, "--wait=false")
        back = wait_until(lambda: (p := all_ready(srv, ns, "web", ["web-0", "web-1", "web-2"]))
                          and p["web-1"]["metadata"]["uid"] != old_uid and p,
                          timeout=TIMEOUT, what="web-1 to come back Ready")
        assert back["web-1"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "data-web-1"
        assert claim_uids(srv, ns) == claims

        # A restart replaces every pod, highest ordinal first; the claims stay.
        before = {n: p["metadata"]["uid"] for n, p in back.items()}
        mark = watch.mark()
        kubectl(srv, "rollout", "restart", "statefulset/web", "-n", ns)
        rollout(srv, ns, "statefulset/web")
        after = wait_until(lambda: all_ready(srv, ns, "web", ["web-0", "web-1", "web-2"]),
                           timeout=TIMEOUT, what="all pods Ready after the restart")
        assert all(after[n]["metadata"]["uid"] != before[n] for n in before)
        assert watch.deletion_started(mark) == ["web-2", "web-1", "web-0"]
        assert claim_uids(srv, ns) == claims
        revisions = {p["metadata"]["labels"]["controller-revision-hash"] for p in after.values()}
        sts = get_json(srv, "statefulset", "web", "-n", ns)
        assert revisions == {sts["status"]["updateRevision"]} == {sts["status"]["currentRevision"]}
        history = kubectl(srv, "rollout", "history", "statefulset/web", "-n", ns)
        assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["1", "2"], history
    finally:
        watch.stop()


def test_scale_down_keeps_claims_and_scale_up_reuses_them(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    watch = PodWatch(srv, ns, "app=db").start()
    try:
        apply(srv, headless_service("db", ns), statefulset("db", ns))
        rollout(srv, ns, "statefulset/db")
        claims = claim_uids(srv, ns)
        assert len(claims) == 3

        mark = watch.mark()
        kubectl(srv, "scale", "statefulset/db", "--replicas=1", "-n", ns)
        wait_until(lambda: sorted(pods_by_name(srv, ns, "db")) == ["db-0"] and
                   not get_json(srv, "pods", "-n", ns, "-l", "app=db")["items"][1:],
                   timeout=TIMEOUT, what="scale-down to db-0")
        assert watch.deletion_started(mark) == ["db-2", "db-1"]
        assert claim_uids(srv, ns) == claims  # kept for when the set grows again

        kubectl(srv, "scale", "statefulset/db", "--replicas=3", "-n", ns)
        rollout(srv, ns, "statefulset/db")
        pods = wait_until(lambda: all_ready(srv, ns, "db", ["db-0", "db-1", "db-2"]),
                          timeout=TIMEOUT, what="scale-up")
        assert claim_uids(srv, ns) == claims
        for i in (1, 2):
            assert pods[f"db-{i}"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == f"data-db-{i}"
    finally:
        watch.stop()


def images(srv: FleetServer, ns: str, app: str) -> dict[str, str]:
    return {n: p["spec"]["containers"][0]["image"] for n, p in pods_by_name(srv, ns, app).items()}


def test_rolling_update_with_partition_and_undo(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    apply(srv, statefulset("part", ns, claims=False))
    rollout(srv, ns, "statefulset/part")

    patch = {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}},
                      "template": {"spec": {"containers": [{"name": "c", "image": "img:v2"}]}}}}
    kubectl(srv, "patch", "statefulset", "part", "-n", ns, "-p", json.dumps(patch))
    out = rollout(srv, ns, "statefulset/part")
    assert "partitioned roll out complete: 1 new pods have been updated" in out, out
    wait_until(lambda: images(srv, ns, "part") == {"part-0": "img:v1", "part-1": "img:v1", "part-2": "img:v2"}
               and all_ready(srv, ns, "part", ["part-0", "part-1", "part-2"]),
               timeout=TIMEOUT, what="only part-2 updated")
    # Below the partition a deleted pod comes back at the current (old) revision.
    old_uid = pods_by_name(srv, ns, "part")["part-0"]["metadata"]["uid"]
    kubectl(srv, "delete", "pod", "part-0", "-n", ns, "--wait=false")
    back = wait_until(lambda: (p := all_ready(srv, ns, "part", ["part-0", "part-1", "part-2"]))
                      and p["part-0"]["metadata"]["uid"] != old_uid and p,
                      timeout=TIMEOUT, what="part-0 to come back")
    assert back["part-0"]["spec"]["containers"][0]["image"] == "img:v1"
    sts = get_json(srv, "statefulset", "part", "-n", ns)
    assert sts["status"]["updatedReplicas"] == 1 and sts["status"]["currentRevision"] != \
        sts["status"]["updateRevision"]

    kubectl(srv, "patch", "statefulset", "part", "-n", ns, "-p",
            json.dumps({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}))
    rollout(srv, ns, "statefulset/part")
    wait_until(lambda: set(images(srv, ns, "part").values()) == {"img:v2"}
               and all_ready(srv, ns, "part", ["part-0", "part-1", "part-2"]),
               timeout=TIMEOUT, what="every pod at v2")
    sts = get_json(srv, "statefulset", "part", "-n", ns)
    assert sts["status"]["currentRevision"] == sts["status"]["updateRevision"]
    assert sts["status"]["updatedReplicas"] == 3

    # Roll back to v1 with the ControllerRevision history.
    kubectl(srv, "rollout", "undo", "statefulset/part", "-n", ns)
    rollout(srv, ns, "statefulset/part")
    wait_until(lambda: set(images(srv, ns, "part").values()) == {"img:v1"}
               and all_ready(srv, ns, "part", ["part-0", "part-1", "part-2"]),
               timeout=TIMEOUT, what="every pod back at v1")
    revs = sorted((r["revision"], r["metadata"]["name"])
                  for r in get_json(srv, "controllerrevisions", "-n", ns)["items"])
    assert [n for n, _ in revs] == [2, 3]  # the v1 revision was renumbered, not copied


def test_claim_retention_policy_delete(cluster: FleetServer, ns: str) -> None:
    srv = cluster
    apply(srv, statefulset("ret", ns, replicas=2, persistentVolumeClaimRetentionPolicy={
        "whenDeleted": "Delete", "whenScaled": "Delete"}))
    rollout(srv, ns, "statefulset/ret")
    sts = get_json(srv, "statefulset", "ret", "-n", ns)

    def owners(claim: dict[str, Any]) -> list[tuple[str, str]]:
        return [(r["kind"], r["uid"]) for r in claim["metadata"].get("ownerReferences") or []]

    claims = {c["metadata"]["name"]: c for c in get_json(srv, "pvc", "-n", ns)["items"]}
    assert {n: owners(c) for n, c in claims.items()} == {
        "data-ret-0": [("StatefulSet", sts["metadata"]["uid"])],
        "data-ret-1": [("StatefulSet", sts["metadata"]["uid"])]}

    pod1 = pods_by_name(srv, ns, "ret")["ret-1"]
    kubectl(srv, "scale", "statefulset/ret", "--replicas=1", "-n", ns)

    def handed_over() -> bool:
        # The scaled-away claim now belongs to its pod, so the garbage collector
        # removes it with the pod (or already has).
        items = {c["metadata"]["name"]: c for c in get_json(srv, "pvc", "-n", ns)["items"]}
        c = items.get("data-ret-1")
        return c is None or owners(c) == [("Pod", pod1["metadata"]["uid"])]

    wait_until(handed_over, timeout=TIMEOUT, what="data-ret-1 handed to pod ret-1")
    wait_until(lambda: sorted(pods_by_name(srv, ns, "ret")) == ["ret-0"], timeout=TIMEOUT, what="ret-1 gone")
    kept = {c["metadata"]["name"]: c for c in get_json(srv, "pvc", "-n", ns)["items"]}
    assert owners(kept["data-ret-0"]) == [("StatefulSet", sts["metadata"]["uid"])]
    # The garbage collector follows those references: the scaled-away claim went with its
    # pod, and deleting the set takes the rest.
    wait_until(lambda: "data-ret-1" not in claim_uids(srv, ns), timeout=TIMEOUT, what="data-ret-1 collected")
    kubectl(srv, "delete", "statefulset", "ret", "-n", ns)
    wait_until(lambda: not claim_uids(srv, ns), timeout=TIMEOUT, what="data-ret-0 collected with the set")
