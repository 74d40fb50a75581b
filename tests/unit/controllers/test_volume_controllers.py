"""The small storage controllers' decisions: pvc/pv-protection, ephemeral volume claims,
attach/detach, and the guard that keeps controllers of unserved kinds out of the
manager."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from fleet.api import pvmatch as pm
from fleet.api.registry import default_registry
from fleet.controllers import attachdetach as ad
from fleet.controllers import ephemeral as eph
from fleet.controllers import volumeprotection as vp
from fleet.controllers.volume_common import by_pod_claim, served


def pod(name: str = "web", *, ns: str = "default", node: str | None = "n1", phase: str = "Running",
        claims: tuple[str, ...] = ("data",), ephemeral: tuple[str, ...] = (), deleting: bool = False,
        grace: int | None = None, uid: str | None = None) -> dict[str, Any]:
    vols: list[dict[str, Any]] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                                  for i, c in enumerate(claims)]
    vols += [{"name": e, "ephemeral": {"volumeClaimTemplate": {
        "metadata": {"labels": {"app": "web"}, "annotations": {"note": "scratch"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "local-path"}}}} for e in ephemeral]
    vols.append({"name": "cfg", "configMap": {"name": "x"}})
    md: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid or f"uid-{name}"}
    if deleting:
        md["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    if grace is not None:
        md["deletionGracePeriodSeconds"] = grace
    spec: dict[str, Any] = {"volumes": vols}
    if node:
        spec["nodeName"] = node
    return {"metadata": md, "spec": spec, "status": {"phase": phase}}


def claim(name: str = "data", *, ns: str = "default", deleting: bool = True,
          finalizers: tuple[str, ...] = (pm.PVC_PROTECTION,), volume: str = "",
          owner: dict[str, Any] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "finalizers": list(finalizers)}
    if deleting:
        md["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    if owner:
        md["ownerReferences"] = [owner]
    obj: dict[str, Any] = {"metadata": md, "spec": {}, "status": {"phase": "Pending"}}
    if volume:
        obj["spec"]["volumeName"] = volume
        obj["metadata"]["annotations"] = {pm.BIND_COMPLETED: "yes"}
        obj["status"]["phase"] = "Bound"
    return obj


# ---------------------------------------------------------------------------------------
# pvmatch pod helpers and the index


def test_pod_claim_names_and_index() -> None:
    p = pod("db-0", claims=("a", "b"), ephemeral=("scratch",), ns="prod")
    assert pm.pod_claim_names(p) == ["a", "b", "db-0-scratch"]
    assert by_pod_claim(p) == ["prod/a", "prod/b", "prod/db-0-scratch"]


@pytest.mark.parametrize("p, done", [
    (pod(phase="Succeeded"), True), (pod(phase="Failed"), True), (pod(phase="Running"), False),
    (pod(deleting=True, grace=0), True), (pod(deleting=True, grace=30), False), (pod(deleting=True), False),
])
def test_pod_is_terminated(p: dict[str, Any], done: bool) -> None:
    assert pm.pod_is_terminated(p) is done


# ---------------------------------------------------------------------------------------
# pvc-protection


@pytest.mark.parametrize("pods, removable", [
    ([], True),
    ([pod()], False),                                    # a running pod uses it
    ([pod(node=None)], True),                            # not scheduled: cannot start with it
    ([pod(phase="Succeeded")], True),                    # terminated
    ([pod(phase="Failed")], True),
    ([pod(deleting=True, grace=30)], False),             # still shutting down
    ([pod(deleting=True, grace=0)], True),               # shut down / force-deleted
    ([pod(claims=("other",))], True),                    # another claim
    ([pod(ns="elsewhere")], True),                       # same claim name, another namespace
    ([pod(claims=(), ephemeral=("data",), name="x")], True),   # its ephemeral claim is x-data
    ([pod(claims=(), ephemeral=("scratch",), name="data")], True),
    ([pod(phase="Succeeded"), pod("b")], False),
])
def test_pvc_finalizer_removable(pods: list[dict[str, Any]], removable: bool) -> None:
    assert vp.claim_finalizer_removable(claim(), pods) is removable


def test_ephemeral_claim_is_protected_by_its_pod() -> None:
    c = claim("web-scratch", owner={"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-web",
                                    "controller": True})
    assert not vp.claim_finalizer_removable(c, [pod("web", claims=(), ephemeral=("scratch",))])
    assert vp.users(c, [pod("web", claims=(), ephemeral=("scratch",))]) == ["web"]
    # A claim of that name the pod does not control is not its ephemeral volume.
    squatter = claim("web-scratch")
    assert vp.claim_finalizer_removable(squatter, [pod("web", claims=(), ephemeral=("scratch",))])


@pytest.mark.parametrize("c", [claim(deleting=False), claim(finalizers=()), claim(finalizers=("other",))])
def test_pvc_finalizer_not_ours_to_remove(c: dict[str, Any]) -> None:
    assert not vp.claim_finalizer_removable(c, [])


def test_without_finalizer_keeps_the_others() -> None:
    c = claim(finalizers=("a", pm.PVC_PROTECTION, "b"))
    assert vp.without_finalizer(c, pm.PVC_PROTECTION)["metadata"]["finalizers"] == ["a", "b"]
    assert c["metadata"]["finalizers"] == ["a", pm.PVC_PROTECTION, "b"]  # not mutated


# ---------------------------------------------------------------------------------------
# pv-protection


def pv_obj(phase: str, *, deleting: bool = True, finalizers: tuple[str, ...] = (pm.PV_PROTECTION,)) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "v", "finalizers": list(finalizers)}
    if deleting:
        md["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    return {"metadata": md, "spec": {}, "status": {"phase": phase}}


@pytest.mark.parametrize("volume, removable", [
    (pv_obj("Bound"), False), (pv_obj("Available"), True), (pv_obj("Released"), True),
    (pv_obj("Failed"), True), (pv_obj("Pending"), True),
    (pv_obj("Available", deleting=False), False), (pv_obj("Available", finalizers=()), False),
])
def test_pv_finalizer_removable(volume: dict[str, Any], removable: bool) -> None:
    assert vp.volume_finalizer_removable(volume) is removable


# ---------------------------------------------------------------------------------------
# Ephemeral volumes


def test_ephemeral_claims_are_created_owned_by_the_pod() -> None:
    p = pod("web", claims=("data",), ephemeral=("scratch", "cache"))
    plan = eph.plan(p, {})
    assert [c["metadata"]["name"] for c in plan.create] == ["web-scratch", "web-cache"]
    c = plan.create[0]
    assert c["metadata"]["namespace"] == "default"
    assert c["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "web",
                                                 "uid": "uid-web", "controller": True,
                                                 "blockOwnerDeletion": True}]
    assert c["metadata"]["labels"] == {"app": "web"}
    assert c["metadata"]["annotations"] == {"note": "scratch"}
    assert c["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                         "storageClassName": "local-path"}
    assert plan.conflicts == []


def test_existing_ephemeral_claim_of_the_pod_is_left_alone() -> None:
    p = pod("web", claims=(), ephemeral=("scratch",))
    mine = claim("web-scratch", deleting=False, owner={"apiVersion": "v1", "kind": "Pod", "name": "web",
                                                        "uid": "uid-web", "controller": True})
    plan = eph.plan(p, {"web-scratch": mine})
    assert plan.create == [] and plan.conflicts == []


@pytest.mark.parametrize("owner", [
    None,
    {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-old-web", "controller": True},
    {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-web"},  # owner, not controller
])
def test_conflicting_claim_is_reported_not_touched(owner: dict[str, Any] | None) -> None:
    p = pod("web", claims=(), ephemeral=("scratch",))
    plan = eph.plan(p, {"web-scratch": claim("web-scratch", deleting=False, owner=owner)})
    assert plan.create == []
    assert plan.conflicts == [("scratch", "PVC default/web-scratch was not created for pod default/web "
                                          "(pod is not owner)")]


def test_deleting_pod_gets_no_claims() -> None:
    assert eph.plan(pod(claims=(), ephemeral=("s",), deleting=True), {}).create == []
    assert not eph.has_ephemeral(pod(claims=("a",)))
    assert eph.has_ephemeral(pod(claims=(), ephemeral=("s",)))


# ---------------------------------------------------------------------------------------
# Attach/detach


def csi_pv(name: str, driver: str, handle: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"csi": {"driver": driver, "volumeHandle": handle}}}


def csidriver(name: str, attach: bool | None) -> dict[str, Any]:
    spec = {} if attach is None else {"attachRequired": attach}
    return {"metadata": {"name": name}, "spec": spec}


def test_attachment_name_is_kubernetes() -> None:
    want = "csi-" + hashlib.sha256(b"vol-1" + b"ebs.csi.aws.com" + b"node-a").hexdigest()
    assert ad.attachment_name("vol-1", "ebs.csi.aws.com", "node-a") == want


CLAIMS = {"default/data": claim("data", deleting=False, volume="pv-a"),
          "default/logs": claim("logs", deleting=False, volume="pv-b"),
          "default/web-scratch": claim("web-scratch", deleting=False, volume="pv-c"),
          "default/pending": claim("pending", deleting=False)}
VOLUMES = {"pv-a": csi_pv("pv-a", "attach.example", "h-a"), "pv-b": csi_pv("pv-b", "noattach.example", "h-b"),
           "pv-c": csi_pv("pv-c", "attach.example", "h-c"),
           "pv-nfs": {"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"server": "x", "path": "/"}}}}
DRIVERS = {"attach.example": csidriver("attach.example", True),
           "noattach.example": csidriver("noattach.example", False)}


def test_desired_attachments() -> None:
    pods = [pod("web", claims=("data", "logs", "pending", "missing"), ephemeral=("scratch",)),
            pod("other", node="n2", claims=("data",)),
            pod("unscheduled", node=None, claims=("data",)),
            pod("done", node="n3", phase="Succeeded", claims=("data",))]
    want = ad.desired(pods, CLAIMS, VOLUMES, DRIVERS)
    assert sorted((v["spec"]["source"]["persistentVolumeName"], v["spec"]["nodeName"]) for v in want.values()) == [
        ("pv-a", "n1"), ("pv-a", "n2"), ("pv-c", "n1")]
    va = want[ad.attachment_name("h-a", "attach.example", "n1")]
    assert va == {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                  "metadata": {"name": ad.attachment_name("h-a", "attach.example", "n1")},
                  "spec": {"attacher": "attach.example", "nodeName": "n1",
                           "source": {"persistentVolumeName": "pv-a"}},
                  "status": {"attached": False}}


@pytest.mark.parametrize("drivers", [{}, {"attach.example": csidriver("attach.example", None)},
                                     {"attach.example": csidriver("attach.example", False)}])
def test_no_attachment_without_attach_required(drivers: dict[str, Any]) -> None:
    assert ad.desired([pod()], CLAIMS, VOLUMES, drivers) == {}


def test_plan_creates_missing_and_deletes_stale_attachments() -> None:
    keep = ad.attachment(VOLUMES["pv-a"], "n1")
    stale = ad.attachment(VOLUMES["pv-a"], "n9")
    in_use = ad.attachment(VOLUMES["pv-c"], "n2")
    inline = {"metadata": {"name": "inline"}, "spec": {"attacher": "x", "nodeName": "n1",
                                                       "source": {"inlineVolumeSpec": {}}}}
    going = ad.attachment(VOLUMES["pv-c"], "n3")
    going["metadata"]["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    nodes = {"n2": {"metadata": {"name": "n2"},
                    "status": {"volumesInUse": ["kubernetes.io/csi/attach.example^h-c"]}},
             "n9": {"metadata": {"name": "n9"}, "status": {"volumesInUse": ["kubernetes.io/csi/attach.example^h-c"]}}}
    p = ad.plan([pod("web", claims=("data",), ephemeral=("scratch",))], CLAIMS, VOLUMES, DRIVERS,
                [keep, stale, in_use, inline, going], nodes)
    assert [v["metadata"]["name"] for v in p.create] == [ad.attachment_name("h-c", "attach.example", "n1")]
    assert p.delete == [stale["metadata"]["name"]]
    assert p.waiting == [in_use["metadata"]["name"]]


def test_attachment_of_a_gone_node_is_deleted_even_if_it_was_in_use() -> None:
    va = ad.attachment(VOLUMES["pv-a"], "gone")
    p = ad.plan([], CLAIMS, VOLUMES, DRIVERS, [va], {})
    assert p.delete == [va["metadata"]["name"]] and p.waiting == []


# ---------------------------------------------------------------------------------------
# The manager guard


def test_served_checks_the_registry() -> None:
    reg = default_registry()
    assert served([("v1", "pods"), ("v1", "persistentvolumeclaims")], reg)
    assert not served([("v1", "pods"), ("example.com/v1", "widgets")], reg)


def test_storage_controllers_are_listed_only_when_their_kinds_are_served() -> None:
    from fleet.controllers.manager import storage_controllers

    reg = default_registry()
    names = {c.name for c in storage_controllers()}
    assert {"pvc-protection", "ephemeral-volume"} <= names  # claims and pods are always served
    expect_binder = served([("v1", "persistentvolumes"), ("storage.k8s.io/v1", "storageclasses"),
                            ("storage.k8s.io/v1", "csinodes"), ("storage.k8s.io/v1", "csistoragecapacities")], reg)
    assert ("persistentvolume-binder" in names) is expect_binder
