"""The PersistentVolume controller's pure decisions (fleet/controllers/pv_plan.py):
syncClaim and syncVolume case by case, as pv_controller.go's unit test sets do,
plus a convergence check that runs both syncs over an in-memory cluster until
nothing changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.api import pvmatch as pm
from fleet.controllers import pv_plan as pp
from fleet.controllers.pv_plan import Sync, World, plan_claim, plan_volume, select_node
from fleet.storage.driver import Capabilities

NOW = "2026-12-03T07:00:00Z"


def pv(name: str, cap: str = "10Gi", *, cls: str = "", modes: tuple[str, ...] = ("ReadWriteOnce",),
       phase: str | None = "Available", ref: dict[str, Any] | None = None, ann: dict[str, str] | None = None,
       policy: str = "Retain", labels: dict[str, str] | None = None, mode: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"capacity": {"storage": cap}, "accessModes": list(modes),
                 "persistentVolumeReclaimPolicy": policy, "storageClassName": cls}}
    if phase is not None:
        obj["status"] = {"phase": phase}
    if ref is not None:
        obj["spec"]["claimRef"] = ref
    if ann:
        obj["metadata"]["annotations"] = dict(ann)
    if labels:
        obj["metadata"]["labels"] = dict(labels)
    if mode:
        obj["spec"]["volumeMode"] = mode
    return obj


def pvc(name: str = "data", req: str = "5Gi", *, cls: str | None = "", ns: str = "default",
        volume: str = "", ann: dict[str, str] | None = None, phase: str = "Pending",
        modes: tuple[str, ...] = ("ReadWriteOnce",), status: dict[str, Any] | None = None,
        mode: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "resourceVersion": "7"},
        "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": req}}},
        "status": {"phase": phase, **(status or {})}}
    if cls is not None:
        obj["spec"]["storageClassName"] = cls
    if volume:
        obj["spec"]["volumeName"] = volume
    if ann:
        obj["metadata"]["annotations"] = dict(ann)
    if mode:
        obj["spec"]["volumeMode"] = mode
    return obj


def ref_to(claim: dict[str, Any], *, uid: bool = True) -> dict[str, Any]:
    r = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim["metadata"]["namespace"],
         "name": claim["metadata"]["name"]}
    if uid:
        r["uid"] = claim["metadata"]["uid"]
    return r


def sc(name: str, provisioner: str = "example.com/nfs", *, wffc: bool = False, default: bool = False,
       created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                           "metadata": {"name": name, "creationTimestamp": created},
                           "provisioner": provisioner,
                           "volumeBindingMode": "WaitForFirstConsumer" if wffc else "Immediate"}
    if default:
        obj["metadata"]["annotations"] = {pm.DEFAULT_CLASS: "true"}
    return obj


def node(name: str, *, ready: bool = True, unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def csinode(name: str, *drivers: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"drivers": [{"name": d, "nodeID": name} for d in drivers]}}


def capacity(node_name: str, cls: str, cap: str, max_size: str | None = None) -> dict[str, Any]:
    obj = {"metadata": {"name": f"cap-{node_name}-{cls}", "namespace": "kube-system"},
           "storageClassName": cls, "capacity": cap,
           "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node_name}}}
    if max_size:
        obj["maximumVolumeSize"] = max_size
    return obj


def world(*volumes: dict[str, Any], classes: tuple[dict[str, Any], ...] = (), **kw: Any) -> World:
    return World(volumes={v["metadata"]["name"]: v for v in volumes},
                 classes={c["metadata"]["name"]: c for c in classes}, now=NOW, **kw)


def ann(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def events(sync: Sync) -> list[tuple[str, str, str, str]]:
    return list(sync.events)


# ---------------------------------------------------------------------------------------
# Unbound claims without volumeName (unit test set 1)


def test_binds_the_smallest_available_volume_that_fits() -> None:
    claim = pvc(req="5Gi")
    s = plan_claim(claim, world(pv("big", "20Gi"), pv("small", "10Gi"), pv("tiny", "1Gi")))
    assert s.volume is not None and s.claim is not None
    assert s.volume["metadata"]["name"] == "small"
    assert s.volume["spec"]["claimRef"] == {**ref_to(claim), "resourceVersion": "7"}
    assert ann(s.volume) == {pm.BOUND_BY_CONTROLLER: "yes"}
    assert s.volume["status"] == {"phase": "Bound", "lastPhaseTransitionTime": NOW}
    assert s.claim["spec"]["volumeName"] == "small"
    assert ann(s.claim) == {pm.BOUND_BY_CONTROLLER: "yes", pm.BIND_COMPLETED: "yes"}
    assert s.claim["status"] == {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                 "capacity": {"storage": "10Gi"}}
    assert s.events == [] and s.error is None


def test_a_volume_pre_bound_to_the_claim_wins_and_is_not_marked_bound_by_controller() -> None:
    claim = pvc(req="5Gi")
    pre = pv("pre", "50Gi", ref=ref_to(claim, uid=False))
    s = plan_claim(claim, world(pv("small", "10Gi"), pre))
    assert s.volume is not None and s.volume["metadata"]["name"] == "pre"
    assert s.volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert pm.BOUND_BY_CONTROLLER not in ann(s.volume)
    assert s.claim is not None and s.claim["spec"]["volumeName"] == "pre"
    assert ann(s.claim)[pm.BOUND_BY_CONTROLLER] == "yes"


@pytest.mark.parametrize("why, volume", [
    ("too small", pv("v", "1Gi")),
    ("other class", pv("v", cls="fast")),
    ("access modes", pv("v", modes=("ReadOnlyMany",))),
    ("block vs filesystem", pv("v", mode="Block")),
    ("already claimed", pv("v", ref={"namespace": "default", "name": "other", "uid": "x"}, phase="Bound")),
    ("released", pv("v", phase="Released")),
])
def test_no_match_and_no_class_is_failed_binding(why: str, volume: dict[str, Any]) -> None:
    s = plan_claim(pvc(), world(volume))
    assert s.volume is None
    assert s.events == [("claim", "Normal", "FailedBinding",
                         "no persistent volumes available for this claim and no storage class is set")]
    assert s.claim is None  # already Pending, nothing to write
    assert s.requeue == pp.RESYNC


def test_selector_limits_the_candidates() -> None:
    claim = pvc()
    claim["spec"]["selector"] = {"matchLabels": {"tier": "gold"}}
    s = plan_claim(claim, world(pv("plain", "10Gi"), pv("gold", "30Gi", labels={"tier": "gold"})))
    assert s.volume is not None and s.volume["metadata"]["name"] == "gold"


def test_wait_for_first_consumer_is_left_to_the_scheduler() -> None:
    cls = sc("local", wffc=True)
    s = plan_claim(pvc(cls="local"), world(pv("v", cls="local"), classes=(cls,)))
    assert s.volume is None and s.claim is None
    assert s.events == [("claim", "Normal", "WaitForFirstConsumer",
                         "waiting for first consumer to be created before binding")]


@pytest.mark.parametrize("pods, message", [
    (["web-0"], "waiting for pod web-0 to be scheduled"),
    (["web-1", "web-0"], "waiting for pods web-0,web-1 to be scheduled"),
])
def test_wait_for_pod_scheduled_names_the_pods(pods: list[str], message: str) -> None:
    cls = sc("local", wffc=True)
    s = plan_claim(pvc(cls="local"), world(classes=(cls,), unscheduled_pods=pods))
    assert s.events == [("claim", "Normal", "WaitForPodScheduled", message)]


def test_wait_for_first_consumer_still_binds_a_pre_bound_volume() -> None:
    cls = sc("local", wffc=True)
    claim = pvc(cls="local")
    s = plan_claim(claim, world(pv("v", cls="local", ref=ref_to(claim, uid=False)), classes=(cls,)))
    assert s.volume is not None and s.claim is not None and s.claim["spec"]["volumeName"] == "v"


def test_selected_node_hands_a_wffc_claim_to_the_provisioner() -> None:
    cls = sc("local-path", "hostpath.fleet.dev", wffc=True)
    claim = pvc(cls="local-path", ann={pm.SELECTED_NODE: "n1"})
    s = plan_claim(claim, world(classes=(cls,)))
    assert s.claim is not None
    assert ann(s.claim) == {pm.SELECTED_NODE: "n1", pm.STORAGE_PROVISIONER: "hostpath.fleet.dev",
                            pm.BETA_STORAGE_PROVISIONER: "hostpath.fleet.dev"}
    assert s.events == [("claim", "Normal", "ExternalProvisioning",
                         "Waiting for a volume to be created either by the external provisioner "
                         "'hostpath.fleet.dev' or manually by the system administrator. If volume creation "
                         "is delayed, please verify that the provisioner is running and correctly registered.")]
    # Once annotated, a second sync writes nothing but says the same.
    again = plan_claim(s.claim, world(classes=(cls,)))
    assert again.claim is None and [e[2] for e in again.events] == ["ExternalProvisioning"]


def test_immediate_external_provisioner_gets_no_node() -> None:
    cls = sc("nfs", "example.com/nfs")
    s = plan_claim(pvc(cls="nfs"), world(classes=(cls,), nodes=[node("n1")],
                                         csinodes={"n1": csinode("n1", "example.com/nfs")}))
    assert s.claim is not None and pm.SELECTED_NODE not in ann(s.claim)
    assert ann(s.claim)[pm.STORAGE_PROVISIONER] == "example.com/nfs"


def test_missing_class_is_provisioning_failed() -> None:
    s = plan_claim(pvc(cls="gold"), world())
    assert s.events == [("claim", "Warning", "ProvisioningFailed", 'storageclass.storage.k8s.io "gold" not found')]
    assert s.claim is None and s.requeue == pp.RESYNC


def test_in_tree_provisioner_fleet_lacks_is_provisioning_failed() -> None:
    cls = sc("manual", "kubernetes.io/no-provisioner")
    s = plan_claim(pvc(cls="manual"), world(classes=(cls,)))
    assert s.events == [("claim", "Warning", "ProvisioningFailed",
                         "no volume plugin matched name: kubernetes.io/no-provisioner")]


def test_a_matching_static_volume_beats_provisioning() -> None:
    cls = sc("nfs")
    s = plan_claim(pvc(cls="nfs"), world(pv("v", cls="nfs"), classes=(cls,)))
    assert s.volume is not None and not any(e[2] == "ExternalProvisioning" for e in s.events)


# ---------------------------------------------------------------------------------------
# Node choice for node-local Immediate claims


LOCAL = Capabilities(node_local=True, topology_keys=("kubernetes.io/hostname",))
TRACKING = Capabilities(node_local=True, capacity_tracking=True)


def caps_of(mapping: dict[str, Capabilities]) -> Any:
    return lambda name: mapping.get(name)


def test_node_local_immediate_claim_gets_the_node_with_most_room() -> None:
    cls = sc("fast", "local.fleet.dev")
    w = world(classes=(cls,), capabilities=caps_of({"local.fleet.dev": LOCAL}),
              nodes=[node("a"), node("b"), node("c", ready=False), node("d")],
              csinodes={n: csinode(n, "local.fleet.dev") for n in "abc"} | {"d": csinode("d")},
              capacities=[capacity("a", "fast", "8Gi"), capacity("b", "fast", "20Gi"),
                          capacity("c", "fast", "100Gi"), capacity("d", "fast", "100Gi")])
    s = plan_claim(pvc(cls="fast"), w)
    assert s.claim is not None
    assert ann(s.claim)[pm.SELECTED_NODE] == "b"
    assert ann(s.claim)[pm.STORAGE_PROVISIONER] == "local.fleet.dev"
    assert not s.waiting_for_node


def test_node_local_claim_keeps_an_existing_selected_node() -> None:
    cls = sc("fast", "local.fleet.dev")
    w = world(classes=(cls,), capabilities=caps_of({"local.fleet.dev": LOCAL}), nodes=[node("a")],
              csinodes={"a": csinode("a", "local.fleet.dev")})
    s = plan_claim(pvc(cls="fast", ann={pm.SELECTED_NODE: "z"}), w)
    assert s.claim is not None and ann(s.claim)[pm.SELECTED_NODE] == "z"


def test_node_local_claim_with_no_node_waits_with_a_warning() -> None:
    cls = sc("fast", "local.fleet.dev")
    w = world(classes=(cls,), capabilities=caps_of({"local.fleet.dev": LOCAL}),
              nodes=[node("a", unschedulable=True)], csinodes={"a": csinode("a", "local.fleet.dev")})
    s = plan_claim(pvc(cls="fast"), w)
    assert s.waiting_for_node
    assert s.claim is not None and pm.SELECTED_NODE not in ann(s.claim)
    assert s.events == [("claim", "Warning", "ProvisioningFailed", pp.NO_NODE_MESSAGE.format("local.fleet.dev"))]


@pytest.mark.parametrize("caps, capacities, size, want", [
    # nothing published: any node with the driver (by name)
    (LOCAL, [], "5Gi", "a"),
    # published room first, most room first
    (LOCAL, [capacity("b", "c", "6Gi"), capacity("c", "c", "9Gi")], "5Gi", "c"),
    # too little room disqualifies; unpublished nodes come after those with room
    (LOCAL, [capacity("a", "c", "1Gi"), capacity("b", "c", "6Gi")], "5Gi", "b"),
    (LOCAL, [capacity("a", "c", "1Gi")], "5Gi", "b"),
    # maximumVolumeSize caps a single volume
    (LOCAL, [capacity("a", "c", "100Gi", max_size="2Gi"), capacity("b", "c", "6Gi")], "5Gi", "b"),
    # another class's capacity does not count
    (LOCAL, [capacity("c", "other", "100Gi")], "5Gi", "a"),
    # a capacity-tracking driver needs published room
    (TRACKING, [], "5Gi", None),
    (TRACKING, [capacity("c", "c", "5Gi")], "5Gi", "c"),
    (TRACKING, [capacity("c", "c", "4Gi")], "5Gi", None),
])
def test_select_node(caps: Capabilities, capacities: list[dict[str, Any]], size: str,
                     want: str | None) -> None:
    nodes = [node("a"), node("b"), node("c")]
    csinodes = {n: csinode(n, "drv") for n in "abc"}
    got = select_node("drv", "c", pm.quantity(size), nodes, csinodes, capacities,
                      tracks_capacity=caps.capacity_tracking)
    assert got == want


# ---------------------------------------------------------------------------------------
# Claims naming a volume (unit test set 2)


def test_claim_naming_a_free_volume_binds_to_it() -> None:
    claim = pvc(volume="v")
    s = plan_claim(claim, world(pv("small", "6Gi"), pv("v", "100Gi")))
    assert s.volume is not None and s.volume["metadata"]["name"] == "v"
    assert ann(s.volume) == {pm.BOUND_BY_CONTROLLER: "yes"}
    assert s.claim is not None and ann(s.claim) == {pm.BIND_COMPLETED: "yes"}  # the user chose the volume


def test_claim_naming_a_missing_volume_stays_pending() -> None:
    s = plan_claim(pvc(volume="nope"), world())
    assert s.volume is None and s.claim is None and s.events == [] and s.requeue == pp.RESYNC


@pytest.mark.parametrize("volume, why", [
    (pv("v", "1Gi"), "requested PV is too small"),
    (pv("v", cls="fast"), "storageClassName does not match"),
    (pv("v", mode="Block"), "incompatible volumeMode"),
    (pv("v", modes=("ReadOnlyMany",)), "incompatible accessMode"),
])
def test_claim_naming_an_unfit_volume_is_volume_mismatch(volume: dict[str, Any], why: str) -> None:
    s = plan_claim(pvc(volume="v"), world(volume))
    assert s.volume is None
    assert s.events == [("claim", "Warning", "VolumeMismatch", f"Cannot bind to requested volume 'v': {why}")]


def test_claim_naming_a_volume_pre_bound_to_it_finishes_the_binding() -> None:
    claim = pvc(volume="v")
    s = plan_claim(claim, world(pv("v", ref=ref_to(claim, uid=False))))
    assert s.volume is not None and s.volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert s.claim is not None and s.claim["status"]["phase"] == "Bound"


def test_claim_naming_a_volume_of_another_claim_is_failed_binding() -> None:
    s = plan_claim(pvc(volume="v"), world(pv("v", ref={"namespace": "default", "name": "x", "uid": "u"})))
    assert s.volume is None and s.error is None
    assert s.events == [("claim", "Warning", "FailedBinding", "volume 'v' already bound to a different claim.")]


def test_controller_bound_claim_on_a_volume_of_another_claim_is_an_error() -> None:
    s = plan_claim(pvc(volume="v", ann={pm.BOUND_BY_CONTROLLER: "yes"}),
                   world(pv("v", ref={"namespace": "default", "name": "x", "uid": "u"})))
    assert s.error is not None and "volume already claimed by 'default/x'" in s.error


# ---------------------------------------------------------------------------------------
# Bound claims (unit test set 3)


def bound_pair(cap: str = "10Gi") -> tuple[dict[str, Any], dict[str, Any]]:
    claim = pvc(volume="v", phase="Bound", ann={pm.BIND_COMPLETED: "yes", pm.BOUND_BY_CONTROLLER: "yes"},
                status={"accessModes": ["ReadWriteOnce"], "capacity": {"storage": cap}})
    volume = pv("v", cap, ref=ref_to(claim), phase="Bound", ann={pm.BOUND_BY_CONTROLLER: "yes"})
    return claim, volume


def test_a_consistent_binding_writes_nothing() -> None:
    claim, volume = bound_pair()
    s = plan_claim(claim, world(volume))
    assert (s.volume, s.claim, s.events, s.error) == (None, None, [], None)
    s = plan_volume(volume, claim, NOW)
    assert (s.volume, s.claim, s.events) == (None, None, [])


def test_bound_claim_keeps_its_capacity_while_the_volume_is_resized() -> None:
    claim, volume = bound_pair("10Gi")
    volume["spec"]["capacity"]["storage"] = "20Gi"
    s = plan_claim(claim, world(volume))
    assert s.claim is None  # status.capacity is the resize path's, not the binder's


@pytest.mark.parametrize("mutate, reason, message", [
    (lambda c, v: c["spec"].pop("volumeName"), "ClaimLost",
     "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!"),
    (lambda c, v: v["metadata"].update(name="gone"), "ClaimLost",
     "Bound claim has lost its PersistentVolume. Data on the volume is lost!"),
    (lambda c, v: v["spec"]["claimRef"].update(uid="someone-else"), "ClaimMisbound",
     "Two claims are bound to the same volume, this one is bound incorrectly"),
])
def test_bound_claim_lost(mutate: Any, reason: str, message: str) -> None:
    claim, volume = bound_pair()
    mutate(claim, volume)
    s = plan_claim(claim, world(volume))
    assert s.claim is not None and s.claim["status"] == {"phase": "Lost"}
    assert s.events == [("claim", "Warning", reason, message)]
    # Lost is terminal: the next sync writes and reports nothing more.
    again = plan_claim(s.claim, world(volume))
    assert again.claim is None and again.events == []


def test_bound_claim_whose_volume_lost_its_claim_ref_is_bound_again() -> None:
    claim, volume = bound_pair()
    del volume["spec"]["claimRef"]
    volume["status"]["phase"] = "Available"
    s = plan_claim(claim, world(volume))
    assert s.volume is not None and s.volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert s.volume["status"]["phase"] == "Bound"
    assert s.claim is None


# ---------------------------------------------------------------------------------------
# Retroactive default class


def test_claim_without_class_gets_the_default_retroactively() -> None:
    claim = pvc(cls=None)
    s = plan_claim(claim, world(classes=(sc("old", default=True, created="2026-01-01T00:00:00Z"),
                                         sc("new", default=True, created="2026-02-01T00:00:00Z"), sc("x"))))
    assert s.claim is not None and s.claim["spec"]["storageClassName"] == "new"
    assert s.volume is None and s.events == []


@pytest.mark.parametrize("claim", [
    pvc(cls=""),  # "" explicitly asks for volumes without a class
    pvc(cls=None, ann={pm.BETA_STORAGE_CLASS: ""}),
    pvc(cls=None, volume="v"),
])
def test_no_retroactive_default(claim: dict[str, Any]) -> None:
    assert pp.retroactive_default_class(claim, {"d": sc("d", default=True)}) is None


# ---------------------------------------------------------------------------------------
# Volumes (unit test set 4)


def test_unclaimed_volume_becomes_available() -> None:
    s = plan_volume(pv("v", phase=None), None, NOW)
    assert s.volume is not None and s.volume["status"] == {"phase": "Available", "lastPhaseTransitionTime": NOW}
    assert plan_volume(s.volume, None, NOW).volume is None


def test_pre_bound_volume_is_available_and_queues_its_claim() -> None:
    claim = pvc()
    s = plan_volume(pv("v", phase="Pending", ref=ref_to(claim, uid=False)), claim, NOW)
    assert s.volume is not None and s.volume["status"]["phase"] == "Available"
    assert s.enqueue_claim == "default/data"


@pytest.mark.parametrize("policy, ann_, phase, message, event", [
    ("Retain", {}, "Released", None, None),
    ("Delete", {pm.PROVISIONED_BY: "hostpath.fleet.dev"}, "Released", None, None),
    ("Delete", {}, "Failed", "no deletable volume plugin matched",
     ("volume", "Warning", "VolumeFailedDelete", "no deletable volume plugin matched")),
    ("Recycle", {}, "Failed", "Volume has unrecognized PersistentVolumeReclaimPolicy",
     ("volume", "Warning", "VolumeUnknownReclaimPolicy", "Volume has unrecognized PersistentVolumeReclaimPolicy")),
])
def test_volume_whose_claim_is_gone(policy: str, ann_: dict[str, str], phase: str, message: str | None,
                                    event: tuple[str, ...] | None) -> None:
    claim = pvc()
    volume = pv("v", phase="Bound", ref=ref_to(claim), policy=policy, ann=ann_)
    s = plan_volume(volume, None, NOW)
    assert s.volume is not None and s.volume["status"]["phase"] == phase
    assert s.volume["status"].get("message") == message
    assert s.volume["spec"]["claimRef"] == ref_to(claim)  # kept: Retain's "Released" is still tied to it
    assert s.events == ([event] if event else [])
    # The next sync changes nothing and does not repeat the event.
    again = plan_volume(s.volume, None, NOW)
    assert again.volume is None and again.events == []


def test_claim_of_the_same_name_but_another_uid_counts_as_gone() -> None:
    claim = pvc()
    volume = pv("v", phase="Bound", ref={**ref_to(claim), "uid": "old-uid"})
    s = plan_volume(volume, claim, NOW)
    assert s.volume is not None and s.volume["status"]["phase"] == "Released"


def test_volume_bound_to_its_claim_is_bound() -> None:
    claim, volume = bound_pair()
    volume["status"]["phase"] = "Available"
    s = plan_volume(volume, claim, NOW)
    assert s.volume is not None and s.volume["status"]["phase"] == "Bound"


def test_volume_whose_claim_is_not_bound_yet_queues_the_claim() -> None:
    claim = pvc()
    s = plan_volume(pv("v", ref=ref_to(claim), ann={pm.PROVISIONED_BY: "x"}), claim, NOW)
    assert s.volume is None and s.enqueue_claim == "default/data"


def test_volume_mode_mismatch_is_reported_on_both() -> None:
    claim = pvc(mode="Block")
    s = plan_volume(pv("v", ref=ref_to(claim)), claim, NOW)
    assert [(e[0], e[2]) for e in s.events] == [("volume", "VolumeMismatch"), ("claim", "VolumeMismatch")]
    assert s.enqueue_claim is None


def test_volume_bound_by_controller_to_a_claim_bound_elsewhere_is_unbound() -> None:
    claim = pvc(volume="other", phase="Bound", ann={pm.BIND_COMPLETED: "yes"})
    volume = pv("v", phase="Bound", ref=ref_to(claim), ann={pm.BOUND_BY_CONTROLLER: "yes"})
    s = plan_volume(volume, claim, NOW)
    assert s.volume is not None and "claimRef" not in s.volume["spec"]
    assert ann(s.volume) == {} and s.volume["status"]["phase"] == "Available"


def test_user_pre_bound_volume_keeps_its_claim_ref_without_uid() -> None:
    claim = pvc(volume="other", phase="Bound", ann={pm.BIND_COMPLETED: "yes"})
    volume = pv("v", phase="Bound", ref=ref_to(claim))
    s = plan_volume(volume, claim, NOW)
    assert s.volume is not None and s.volume["spec"]["claimRef"] == ref_to(claim, uid=False)
    assert s.volume["status"]["phase"] == "Available"


def test_provisioned_volume_for_a_claim_bound_elsewhere_is_released() -> None:
    claim = pvc(volume="other", phase="Bound", ann={pm.BIND_COMPLETED: "yes"})
    volume = pv("v", phase="Bound", ref=ref_to(claim), policy="Delete", ann={pm.PROVISIONED_BY: "d"})
    s = plan_volume(volume, claim, NOW)
    assert s.volume is not None and s.volume["status"]["phase"] == "Released"


# ---------------------------------------------------------------------------------------
# Convergence: both syncs over an in-memory cluster until nothing changes


def converge(claims: list[dict[str, Any]], volumes: list[dict[str, Any]], *, rounds: int = 6,
             classes: tuple[dict[str, Any], ...] = ()) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    cs = {c["metadata"]["name"]: copy.deepcopy(c) for c in claims}
    vs = {v["metadata"]["name"]: copy.deepcopy(v) for v in volumes}
    for _ in range(rounds):
        changed = False
        for name in sorted(cs):
            s = plan_claim(cs[name], world(*vs.values(), classes=classes))
            assert s.error is None
            if s.volume is not None:
                vs[s.volume["metadata"]["name"]] = s.volume
                changed = True
            if s.claim is not None:
                cs[name] = s.claim
                changed = True
        for name in sorted(vs):
            ref = vs[name]["spec"].get("claimRef") or {}
            s = plan_volume(vs[name], cs.get(ref.get("name", "")), NOW)
            if s.volume is not None:
                vs[name] = s.volume
                changed = True
        if not changed:
            return cs, vs
    raise AssertionError("did not converge")


@pytest.mark.parametrize("sizes, requests", [
    (["10Gi", "5Gi", "20Gi"], ["4Gi", "9Gi", "15Gi"]),
    (["10Gi", "10Gi"], ["1Gi", "1Gi", "1Gi"]),
    (["1Gi"], ["2Gi"]),
    (["8Gi", "2Gi", "4Gi", "16Gi"], ["3Gi", "3Gi", "1Gi", "9Gi"]),
])
def test_static_binding_converges_one_volume_per_claim(sizes: list[str], requests: list[str]) -> None:
    claims = [pvc(f"c{i}", r) for i, r in enumerate(requests)]
    volumes = [pv(f"v{i}", s, phase=None) for i, s in enumerate(sizes)]
    cs, vs = converge(claims, volumes)
    used: set[str] = set()
    for c in cs.values():
        if c["status"]["phase"] == "Bound":
            v = vs[c["spec"]["volumeName"]]
            assert v["status"]["phase"] == "Bound"
            assert v["spec"]["claimRef"]["uid"] == c["metadata"]["uid"]
            assert pm.volume_capacity(v) >= pm.claim_request(c)
            assert c["spec"]["volumeName"] not in used
            used.add(c["spec"]["volumeName"])
        else:
            assert c["status"]["phase"] == "Pending"
    for name, v in vs.items():
        assert v["status"]["phase"] == ("Bound" if name in used else "Available")
    # Every claim that could have had a volume got one (first-come, smallest fit).
    assert len(used) == min(len(sizes), sum(
        1 for r in requests if any(pm.quantity(s) >= pm.quantity(r) for s in sizes)))


def test_deleting_the_claim_releases_and_rebinding_after_claim_ref_removal() -> None:
    cs, vs = converge([pvc("c")], [pv("v", phase=None)])
    assert vs["v"]["status"]["phase"] == "Bound"
    cs, vs = converge([], list(vs.values()))
    assert vs["v"]["status"]["phase"] == "Released"  # Retain
    del vs["v"]["spec"]["claimRef"]  # the administrator makes it available again
    cs, vs = converge([pvc("d")], list(vs.values()))
    assert vs["v"]["status"]["phase"] == "Bound" and cs["d"]["spec"]["volumeName"] == "v"


# ---------------------------------------------------------------------------------------
# Property: any mix of static volumes and claims converges to a consistent binding


SIZES = st.sampled_from(["1Gi", "2Gi", "5Gi", "10Gi"])
CLASSES = st.sampled_from(["", "fast"])
MODES = st.sampled_from([("ReadWriteOnce",), ("ReadWriteMany",), ("ReadWriteOnce", "ReadOnlyMany")])


@given(vols=st.lists(st.tuples(SIZES, CLASSES, MODES), max_size=6),
       claims=st.lists(st.tuples(SIZES, CLASSES, MODES), max_size=6),
       prebind=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=3))
def test_binding_converges_consistently(vols: list[Any], claims: list[Any], prebind: list[Any]) -> None:
    cl = [pvc(f"c{i}", size, cls=cls, modes=modes[:1]) for i, (size, cls, modes) in enumerate(claims)]
    vs = [pv(f"v{i}", size, cls=cls, modes=modes, phase=None) for i, (size, cls, modes) in enumerate(vols)]
    for v_i, c_i in prebind:  # some volumes are pre-bound by their creator
        if v_i < len(vs) and c_i < len(cl) and "claimRef" not in vs[v_i]["spec"]:
            vs[v_i]["spec"]["claimRef"] = ref_to(cl[c_i], uid=False)
    cs, vv = converge(cl, vs, rounds=12)
    holders: dict[str, str] = {}
    for c in cs.values():
        name = c["spec"].get("volumeName")
        if c["status"]["phase"] == "Bound":
            v = vv[name]
            assert v["spec"]["claimRef"]["uid"] == c["metadata"]["uid"]
            assert v["status"]["phase"] == "Bound"
            assert pm.volume_capacity(v) >= pm.claim_request(c)
            assert pm.volume_class(v) == pm.claim_class(c)
            assert name not in holders
            holders[name] = c["metadata"]["name"]
        else:
            assert c["status"]["phase"] == "Pending" and not name
    for name, v in vv.items():
        ref = v["spec"].get("claimRef")
        if name in holders:
            continue
        # Free volumes are Available, pre-bound ones stay reserved for their claim.
        assert v["status"]["phase"] == "Available"
        assert not ref or not ref.get("uid")
    # Nobody is left waiting while a free, fitting, unreserved volume exists.
    for c in cs.values():
        if c["status"]["phase"] != "Bound":
            free = [v for n, v in vv.items() if n not in holders and not v["spec"].get("claimRef")]
            assert pm.find_matching_volume(c, free) is None
