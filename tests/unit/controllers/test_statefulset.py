"""The StatefulSet plan: ordered creation and scale-down, claims, retention, rolling updates (pure)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.controllers import history
from fleet.controllers.statefulset import (
    POD_INDEX_LABEL,
    POD_NAME_LABEL,
    REVISION_LABEL,
    Settings,
    claim_owner_refs,
    claims_for,
    new_pod,
    parent_and_ordinal,
    plan_statefulset,
)

NOW = 1_000_000.0
V1 = {"metadata": {"labels": {"app": "web"}},
      "spec": {"containers": [{"name": "c", "image": "img:1"}], "restartPolicy": "Always"}}
V2 = {"metadata": {"labels": {"app": "web"}},
      "spec": {"containers": [{"name": "c", "image": "img:2"}], "restartPolicy": "Always"}}


def make_sts(replicas: int = 3, *, policy: str = "OrderedReady", strategy: str = "RollingUpdate",
             partition: int = 0, template: dict[str, Any] | None = None, claims: tuple[str, ...] = ("data",),
             retention: tuple[str, str] = ("Retain", "Retain"), min_ready: int = 0,
             deleting: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas, "podManagementPolicy": policy, "serviceName": "web-svc",
        "selector": {"matchLabels": {"app": "web"}},
        "template": copy.deepcopy(template or V1),
        "updateStrategy": {"type": strategy, **({"rollingUpdate": {"partition": partition}}
                                                  if strategy == "RollingUpdate" else {})},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": retention[0], "whenScaled": retention[1]},
        "volumeClaimTemplates": [{"metadata": {"name": n}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}} for n in claims],
        "minReadySeconds": min_ready,
    }
    md: dict[str, Any] = {"name": "web", "namespace": "ns", "uid": "sts-uid", "generation": 4}
    if deleting:
        md["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": md, "spec": spec}


def make_rev(name: str, template: dict[str, Any], n: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "revision": n,
            "data": history.template_patch({"spec": {"template": template}})}


REV1 = make_rev("web-rev1", V1, 1)
REV2 = make_rev("web-rev2", V2, 2)


def make_pod(o: int, *, rev: str = "web-rev1", phase: str = "Running", ready: bool = True,
             terminating: bool = False, ready_since: float = NOW - 3600, labels: bool = True) -> dict[str, Any]:
    import datetime as dt
    since = dt.datetime.fromtimestamp(ready_since, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    md: dict[str, Any] = {"name": f"web-{o}", "namespace": "ns", "uid": f"pod-{o}",
                          "labels": {"app": "web", REVISION_LABEL: rev,
                                     **({POD_NAME_LABEL: f"web-{o}", POD_INDEX_LABEL: str(o)} if labels else {})},
                          "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                               "uid": "sts-uid", "controller": True}]}
    if terminating:
        md["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": md, "spec": {}, "status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": since}]}}


def make_claim(name: str, *, terminating: bool = False, refs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7"}
    if terminating:
        md["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    if refs:
        md["ownerReferences"] = refs
    return {"metadata": md, "spec": {}}


def claims_of(*ordinals: int, **kw: Any) -> dict[str, dict[str, Any]]:
    return {f"data-web-{o}": make_claim(f"data-web-{o}", **kw) for o in ordinals}


def plan(sts: dict[str, Any], pods: list[dict[str, Any]], claims: dict[str, dict[str, Any]] | None = None,
         cur: dict[str, Any] = REV1, upd: dict[str, Any] = REV1) -> Any:
    return plan_statefulset(sts, pods, claims or {}, cur, upd, 0, NOW)


def summary(p: Any) -> tuple[list[str], list[str]]:
    return ([c.pod["metadata"]["name"] for c in p.create], [d["metadata"]["name"] for d in p.delete])


# ---------------------------------------------------------------------------------------
# Scaling in order


ORDERED = [
    # (id, sts kwargs, pods, claims, expected (creates, deletes))
    ("empty: create web-0 only", {}, [], {}, (["web-0"], [])),
    ("web-0 pending: wait", {}, [make_pod(0, phase="Pending", ready=False)], claims_of(0), ([], [])),
    ("web-0 running, not ready: wait", {}, [make_pod(0, ready=False)], claims_of(0), ([], [])),
    ("web-0 ready: create web-1", {}, [make_pod(0)], claims_of(0), (["web-1"], [])),
    ("gap at web-1 is filled before web-2", {}, [make_pod(0), make_pod(2)], claims_of(0, 2), (["web-1"], [])),
    ("all ready: nothing", {}, [make_pod(0), make_pod(1), make_pod(2)], claims_of(0, 1, 2), ([], [])),
    ("scale down 3→1: highest first, one at a time", {"replicas": 1},
     [make_pod(0), make_pod(1), make_pod(2)], claims_of(0, 1, 2), ([], ["web-2"])),
    ("scale down waits for the terminating one", {"replicas": 1},
     [make_pod(0), make_pod(1), make_pod(2, terminating=True)], claims_of(0, 1, 2), ([], [])),
    ("scale down waits for an unhealthy lower pod", {"replicas": 2},
     [make_pod(0), make_pod(1, ready=False), make_pod(2)], claims_of(0, 1, 2), ([], [])),
    ("the lowest unhealthy condemned pod may go", {"replicas": 1},
     [make_pod(0), make_pod(1, ready=False)], claims_of(0, 1), ([], ["web-1"])),
    ("a failed pod is deleted to be re-created", {},
     [make_pod(0), make_pod(1, phase="Failed", ready=False), make_pod(2)], claims_of(0, 1, 2), ([], ["web-1"])),
    ("a terminating in-range pod blocks", {}, [make_pod(0, terminating=True)], claims_of(0), ([], [])),
    ("scale to zero", {"replicas": 0}, [make_pod(0), make_pod(1)], claims_of(0, 1), ([], ["web-1"])),
    ("parallel: all at once", {"policy": "Parallel"}, [], {}, (["web-0", "web-1", "web-2"], [])),
    ("parallel: no wait for readiness", {"policy": "Parallel"},
     [make_pod(0, phase="Pending", ready=False)], claims_of(0), (["web-1", "web-2"], [])),
    ("parallel scale down: all condemned at once", {"policy": "Parallel", "replicas": 1},
     [make_pod(0), make_pod(1, ready=False), make_pod(2)], claims_of(0, 1, 2), ([], ["web-2", "web-1"])),
]


@pytest.mark.parametrize(("kw", "pods", "claims", "want"), [r[1:] for r in ORDERED], ids=[r[0] for r in ORDERED])
def test_ordered_and_parallel(kw, pods, claims, want):
    p = plan(make_sts(**kw), pods, claims)
    assert summary(p) == want


def test_created_pod_identity_storage_and_revision():
    sts = make_sts()
    pod = new_pod(sts, V1, "web-rev1", 2)
    md, spec = pod["metadata"], pod["spec"]
    assert md["name"] == "web-2" and md["namespace"] == "ns"
    assert md["labels"] == {"app": "web", POD_NAME_LABEL: "web-2", POD_INDEX_LABEL: "2", REVISION_LABEL: "web-rev1"}
    assert md["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                      "uid": "sts-uid", "controller": True, "blockOwnerDeletion": True}]
    assert spec["hostname"] == "web-2" and spec["subdomain"] == "web-svc"
    assert spec["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}}]
    assert spec["containers"][0]["image"] == "img:1"


def test_claims_are_created_with_the_pod_and_reused():
    sts = make_sts(claims=("data", "logs"))
    p = plan(sts, [], {})
    assert [c["metadata"]["name"] for c in p.create[0].claims] == ["data-web-0", "logs-web-0"]
    claim = p.create[0].claims[0]
    assert claim["metadata"]["labels"] == {"app": "web"}
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "ownerReferences" not in claim["metadata"]  # Retain: nobody owns it
    # The pod was deleted; its claim is still there: the new pod reuses it.
    p = plan(sts, [], {"data-web-0": make_claim("data-web-0")})
    assert [c["metadata"]["name"] for c in p.create[0].claims] == ["logs-web-0"]
    assert p.create[0].pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "data-web-0"


def test_a_claim_being_deleted_blocks_its_pod():
    p = plan(make_sts(), [], claims_of(0, terminating=True))
    assert summary(p) == ([], []) and "being deleted" in p.waiting


def test_a_pending_pod_gets_its_missing_claim_back():
    p = plan(make_sts(), [make_pod(0, phase="Pending", ready=False)], {})
    assert [c["metadata"]["name"] for c in p.missing_claims] == ["data-web-0"]


def test_missing_identity_labels_are_restored():
    p = plan(make_sts(replicas=1), [make_pod(0, labels=False)], claims_of(0))
    assert [(pod["metadata"]["name"], labels) for pod, labels in p.relabel] == [
        ("web-0", {POD_NAME_LABEL: "web-0", POD_INDEX_LABEL: "0"})]


def test_deleting_set_only_reports_status():
    p = plan(make_sts(deleting=True), [make_pod(0)], claims_of(0))
    assert summary(p) == ([], []) and p.status["replicas"] == 1


def test_ordinals_start():
    sts = make_sts(replicas=2)
    sts["spec"]["ordinals"] = {"start": 5}
    p = plan(sts, [make_pod(5), make_pod(0)], claims_of(5))
    assert summary(p) == (["web-6"], [])  # ordinals 5 and 6; web-0 goes once they are up
    p = plan(sts, [make_pod(5), make_pod(6), make_pod(0)], claims_of(5, 6))
    assert summary(p) == ([], ["web-0"])
    assert Settings.of(sts).in_range(6) and not Settings.of(sts).in_range(7)


# ---------------------------------------------------------------------------------------
# Updates


def pods_at(*revs: str, **kw: Any) -> list[dict[str, Any]]:
    return [make_pod(i, rev=r, **kw) for i, r in enumerate(revs)]


UPDATES = [
    ("rolling: highest old pod goes first", {}, pods_at("web-rev1", "web-rev1", "web-rev1"), ([], ["web-2"])),
    ("rolling: then the next", {}, pods_at("web-rev1", "web-rev1", "web-rev2"), ([], ["web-1"])),
    ("rolling: waits for the new pod to be ready", {},
     [make_pod(0), make_pod(1), make_pod(2, rev="web-rev2", ready=False)], ([], [])),
    ("rolling: done", {}, pods_at("web-rev2", "web-rev2", "web-rev2"), ([], [])),
    ("partition 2: only web-2 is updated", {"partition": 2}, pods_at("web-rev1", "web-rev1", "web-rev2"), ([], [])),
    ("partition 2: web-2 first", {"partition": 2}, pods_at("web-rev1", "web-rev1", "web-rev1"), ([], ["web-2"])),
    ("OnDelete: never deletes for an update", {"strategy": "OnDelete"},
     pods_at("web-rev1", "web-rev1", "web-rev1"), ([], [])),
    ("parallel rolling is still one at a time", {"policy": "Parallel"},
     pods_at("web-rev1", "web-rev1", "web-rev1"), ([], ["web-2"])),
]


@pytest.mark.parametrize(("kw", "pods", "want"), [r[1:] for r in UPDATES], ids=[r[0] for r in UPDATES])
def test_updates(kw, pods, want):
    p = plan(make_sts(template=V2, **kw), pods, claims_of(0, 1, 2), cur=REV1, upd=REV2)
    assert summary(p) == want


@pytest.mark.parametrize(("kw", "ordinal", "rev", "image"), [
    ({"partition": 2}, 0, "web-rev1", "img:1"),   # below the partition: the current revision
    ({"partition": 2}, 2, "web-rev2", "img:2"),
    ({}, 1, "web-rev2", "img:2"),
    ({"strategy": "OnDelete"}, 0, "web-rev2", "img:2"),  # a deleted pod comes back updated
])
def test_recreated_pod_revision(kw, ordinal, rev, image):
    pods = [make_pod(i) for i in range(3) if i != ordinal]
    p = plan(make_sts(template=V2, **kw), pods, claims_of(0, 1, 2), cur=REV1, upd=REV2)
    (created,) = p.create
    assert created.pod["metadata"]["name"] == f"web-{ordinal}"
    assert created.pod["metadata"]["labels"][REVISION_LABEL] == rev
    assert created.pod["spec"]["containers"][0]["image"] == image


def test_status_counts_and_rollout_completion():
    sts = make_sts(template=V2)
    p = plan(sts, [make_pod(0), make_pod(1, rev="web-rev2"), make_pod(2, rev="web-rev2", ready=False)],
             claims_of(0, 1, 2), cur=REV1, upd=REV2)
    assert p.status == {"observedGeneration": 4, "replicas": 3, "readyReplicas": 2, "availableReplicas": 2,
                        "currentReplicas": 1, "updatedReplicas": 2, "currentRevision": "web-rev1",
                        "updateRevision": "web-rev2", "collisionCount": 0}
    p = plan(sts, pods_at("web-rev2", "web-rev2", "web-rev2"), claims_of(0, 1, 2), cur=REV1, upd=REV2)
    assert p.status["currentRevision"] == "web-rev2" and p.status["currentReplicas"] == 3


def test_min_ready_seconds_gates_the_next_pod():
    sts = make_sts(min_ready=30)
    p = plan(sts, [make_pod(0, ready_since=NOW - 10)], claims_of(0))
    assert summary(p) == ([], []) and p.requeue_after == pytest.approx(20)
    assert p.status["readyReplicas"] == 1 and p.status["availableReplicas"] == 0
    p = plan(sts, [make_pod(0, ready_since=NOW - 31)], claims_of(0))
    assert summary(p) == (["web-1"], [])


# ---------------------------------------------------------------------------------------
# persistentVolumeClaimRetentionPolicy


SET_REF = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "sts-uid",
           "controller": True, "blockOwnerDeletion": True}


def pod_ref(o: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "name": f"web-{o}", "uid": f"pod-{o}",
            "controller": True, "blockOwnerDeletion": True}


RETENTION = [
    # (whenDeleted, whenScaled, ordinal (replicas=2), existing refs, expected refs or None)
    ("Retain", "Retain", 0, [], None),
    ("Retain", "Retain", 0, [SET_REF], []),            # a policy change back to Retain drops our ref
    ("Delete", "Retain", 0, [], [SET_REF]),
    ("Delete", "Retain", 3, [], [SET_REF]),            # scaled away: still the set's
    ("Retain", "Delete", 0, [], None),
    ("Retain", "Delete", 3, [], [pod_ref(3)]),         # scaled away: the pod's, goes with it
    ("Delete", "Delete", 0, [], [SET_REF]),
    ("Delete", "Delete", 3, [SET_REF], [pod_ref(3)]),  # hand-over from set to pod on scale-down
    ("Delete", "Delete", 3, [pod_ref(3)], None),
    ("Delete", "Retain", 0, [{**SET_REF, "uid": "older-set"}], None),  # an older set's: left to the GC
    ("Delete", "Retain", 0, [{"apiVersion": "x/v1", "kind": "Other", "name": "o", "uid": "o",
                              "controller": True}], None),  # another controller owns it
]


@pytest.mark.parametrize(("when_deleted", "when_scaled", "ordinal", "refs", "want"), RETENTION)
def test_claim_owner_refs(when_deleted, when_scaled, ordinal, refs, want):
    sts = make_sts(replicas=2, retention=(when_deleted, when_scaled))
    claim = make_claim(f"data-web-{ordinal}", refs=refs)
    assert claim_owner_refs(claim, sts, make_pod(ordinal), Settings.of(sts)) == want


def test_retention_on_create_and_on_scale_down():
    sts = make_sts(replicas=1, retention=("Delete", "Delete"))
    p = plan(sts, [], {})
    assert p.create[0].claims[0]["metadata"]["ownerReferences"] == [SET_REF]
    # Scale-down: web-1's claim is handed to web-1 before web-1 is deleted (in the same plan).
    claims = {"data-web-0": make_claim("data-web-0", refs=[SET_REF]),
              "data-web-1": make_claim("data-web-1", refs=[SET_REF])}
    p = plan(sts, [make_pod(0), make_pod(1)], claims)
    assert [(c["metadata"]["name"], refs) for c, refs in p.claim_refs] == [("data-web-1", [pod_ref(1)])]
    assert summary(p) == ([], ["web-1"])


def test_a_claim_owned_by_a_deleted_pod_is_stale():
    sts = make_sts(replicas=2, retention=("Retain", "Delete"))
    claims = {"data-web-0": make_claim("data-web-0"), "data-web-1": make_claim("data-web-1", refs=[pod_ref(1)])}
    p = plan(sts, [make_pod(0)], claims)
    assert summary(p) == ([], []) and "being deleted" in p.waiting


# ---------------------------------------------------------------------------------------
# Helpers


@pytest.mark.parametrize(("name", "want"), [
    ("web-0", ("web", 0)), ("my-web-12", ("my-web", 12)), ("web", ("", -1)), ("web-x", ("", -1)),
])
def test_parent_and_ordinal(name, want):
    assert parent_and_ordinal(name) == want


def test_claims_for_keeps_template_metadata():
    sts = make_sts()
    sts["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"] = {"tier": "db"}
    sts["spec"]["volumeClaimTemplates"][0]["metadata"]["annotations"] = {"a": "b"}
    (claim,) = claims_for(sts, 1)
    assert claim["metadata"] == {"name": "data-web-1", "namespace": "ns",
                                 "labels": {"tier": "db", "app": "web"}, "annotations": {"a": "b"}}
    assert claim["apiVersion"] == "v1" and claim["kind"] == "PersistentVolumeClaim"
