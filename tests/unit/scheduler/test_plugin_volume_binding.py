"""VolumeBinding: what claims alone tell us, with kube-scheduler's wording."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleet.scheduler.framework import Code, CycleState, FitError, Framework
from fleet.scheduler.plugins import VolumeBinding, default_plugins
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import new_state, node, pod

UNRESOLVABLE = Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def pvc(name: str, *, volume: str | None = None, phase: str | None = None, class_name: str | None = None,
        owner_uid: str | None = None, deleting: bool = False, annotations: dict[str, str] | None = None,
        namespace: str = "default") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations or {}}
    if owner_uid:
        md["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner_uid,
                                  "controller": True}]
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {}
    if volume:
        spec["volumeName"] = volume
    if class_name is not None:
        spec["storageClassName"] = class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": md, "spec": spec,
            "status": {"phase": phase} if phase else {}}


def storage_class(name: str, mode: str) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": "example.com/p", "volumeBindingMode": mode}


def claim_pod(*claims: str, ephemeral: str | None = None) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                                     for i, c in enumerate(claims)]
    if ephemeral:
        volumes.append({"name": ephemeral, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
    return pod(volumes=volumes)


WFFC = storage_class("local", "WaitForFirstConsumer")
IMMEDIATE = storage_class("fast", "Immediate")


@pytest.mark.parametrize(("p", "claims", "want"), [
    (pod(volumes=[{"name": "tmp", "emptyDir": {}}]), [], None),  # no claims: skip
    (claim_pod("data"), [], 'persistentvolumeclaim "data" not found'),
    (claim_pod("data"), [pvc("data", volume="pv1", phase="Bound")], None),
    (claim_pod("data"), [pvc("data", volume="pv1", annotations={"pv.kubernetes.io/bind-completed": "yes"})], None),
    # Unbound, and its class (or no class) binds immediately: wait for the PV controller.
    (claim_pod("data"), [pvc("data")], "pod has unbound immediate PersistentVolumeClaims"),
    (claim_pod("data"), [pvc("data", class_name="fast")], "pod has unbound immediate PersistentVolumeClaims"),
    (claim_pod("data"), [pvc("data", class_name="unknown")], "pod has unbound immediate PersistentVolumeClaims"),
    # volumeName set but the binding not finished yet counts as unbound.
    (claim_pod("data"), [pvc("data", volume="pv1")], "pod has unbound immediate PersistentVolumeClaims"),
    # WaitForFirstConsumer: binding waits for us; nothing to refuse here.
    (claim_pod("data"), [pvc("data", class_name="local")], None),
    (claim_pod("data"), [pvc("data", volume="pv1", phase="Lost")],
     'persistentvolumeclaim "data" bound to non-existent persistentvolume "pv1"'),
    (claim_pod("data"), [pvc("data", volume="pv1", phase="Bound", deleting=True)],
     'persistentvolumeclaim "data" is being deleted'),
    (claim_pod("a", "b"), [pvc("a", volume="pv1", phase="Bound")], 'persistentvolumeclaim "b" not found'),
    # A claim in another namespace is not this pod's.
    (claim_pod("data"), [pvc("data", volume="pv1", phase="Bound", namespace="other")],
     'persistentvolumeclaim "data" not found'),
    # Generic ephemeral volumes: the claim is <pod>-<volume>, created for (owned by) the pod.
    (claim_pod(ephemeral="scratch"), [],
     'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"'),
    (claim_pod(ephemeral="scratch"), [pvc("p-scratch", volume="pv", phase="Bound", owner_uid="someone-else")],
     "PVC default/p-scratch was not created for pod default/p (pod is not owner)"),
    (claim_pod(ephemeral="scratch"), [pvc("p-scratch", volume="pv", phase="Bound", owner_uid="uid-p")], None),
])
def test_pre_filter(p, claims, want):
    snap = Snapshot.build([node("n1")], pvcs=claims, storage_classes=[WFFC, IMMEDIATE])
    st = VolumeBinding().pre_filter(new_state(snap), p)
    if want is None:
        assert st.code is Code.SKIP  # nothing to check per node until PVs are known
    else:
        assert st.code is UNRESOLVABLE and st.reasons == (want,)


def test_stays_out_of_the_way_until_claims_are_listed():
    snap = Snapshot.build([node("n1")])  # no claims given: not synced
    assert VolumeBinding().pre_filter(new_state(snap), claim_pod("data")).code is Code.SKIP
    snap.set_pvc(pvc("data"))
    snap.pvcs_synced = True
    assert VolumeBinding().pre_filter(new_state(snap), claim_pod("data")).code is UNRESOLVABLE
    snap.remove_pvc("default/data")
    assert VolumeBinding().pre_filter(new_state(snap), claim_pod("data")).reasons == (
        'persistentvolumeclaim "data" not found',)


def test_failed_scheduling_message():
    snap = Snapshot.build([node("n1"), node("n2")], pvcs=[])
    fw = Framework(default_plugins(), rng=random.Random(1))
    with pytest.raises(FitError) as exc:
        fw.schedule(claim_pod("data"), snap)
    assert exc.value.unresolvable
    assert str(exc.value) == '0/2 nodes are available: persistentvolumeclaim "data" not found.'


def test_without_snapshot_in_state_filter_judges_per_node():
    snap = Snapshot.build([node("n1")], pvcs=[])
    state = CycleState()
    plugin = VolumeBinding()
    assert plugin.pre_filter(state, claim_pod("data")).ok
    st = plugin.filter(state, claim_pod("data"), snap.nodes()[0])
    assert st.code is UNRESOLVABLE and st.reasons == ('persistentvolumeclaim "data" not found',)
