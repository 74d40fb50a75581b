"""PersistentVolumeClaim and ControllerRevision: defaults, validation, update rules, table cells."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds import apps
from fleet.api.kinds.controllerrevision import controller_cell, validate_controller_revision
from fleet.api.kinds.storage import PERSISTENT_VOLUME_CLAIM, default_pvc, validate_pvc
from fleet.api.registry import default_registry

REG = default_registry()


def pvc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    base.update(spec)
    obj = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "data", "namespace": "ns"}, "spec": {k: v for k, v in base.items() if v is not None}}
    default_pvc(obj)
    return obj


def fields(causes: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in causes]


def test_defaults_pending_and_filesystem():
    obj = pvc()
    assert obj["status"] == {"phase": "Pending"} and obj["spec"]["volumeMode"] == "Filesystem"
    assert validate_pvc(obj, None) == []


@pytest.mark.parametrize(("spec", "want"), [
    ({"accessModes": None}, [("spec.accessModes", "Required value: at least 1 access mode is required")]),
    ({"accessModes": ["ReadWriteSometimes"]},
     [("spec.accessModes", 'Unsupported value: "ReadWriteSometimes": supported values: "ReadOnlyMany", '
                           '"ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"')]),
    ({"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"]},
     [("spec.accessModes", "Forbidden: may not use ReadWriteOncePod with other access modes")]),
    ({"resources": {}}, [("spec.resources[storage]", "Required value")]),
    ({"resources": {"requests": {"storage": "0"}}},
     [("spec.resources[storage]", 'Invalid value: "0": must be greater than zero')]),
    ({"resources": {"requests": {"storage": "lots"}}},
     [("spec.resources.requests[storage]",
       "Invalid value: \"lots\": quantities must match the regular expression "
       "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]),
    ({"volumeMode": "Tape"},
     [("spec.volumeMode", 'Unsupported value: "Tape": supported values: "Block", "Filesystem"')]),
    ({"storageClassName": "Fast_Disk"}, None),
])
def test_validation(spec, want):
    causes = fields(validate_pvc(pvc(**spec), None))
    if want is None:
        assert causes and causes[0][0] == "spec.storageClassName"
    else:
        assert causes == want


def bound(obj: dict[str, Any], capacity: str = "1Gi") -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["volumeName"] = "pv-1"
    obj["status"] = {"phase": "Bound", "capacity": {"storage": capacity}, "accessModes": ["ReadWriteOnce"]}
    return obj


def with_storage(obj: dict[str, Any], size: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["resources"]["requests"]["storage"] = size
    return obj


def test_update_rules():
    old = pvc()
    # The binder fills volumeName once.
    assert validate_pvc(bound(old), old) == []
    # Growing a pending claim is a spec change; growing a bound one is an expansion.
    assert fields(validate_pvc(with_storage(old, "2Gi"), old)) == [
        ("spec", "Forbidden: spec is immutable after creation except resources.requests and "
                 "volumeAttributesClassName for bound claims")]
    assert validate_pvc(with_storage(bound(old), "2Gi"), bound(old)) == []
    # Never below what was provisioned.
    grown = with_storage(bound(old, "2Gi"), "2Gi")
    assert fields(validate_pvc(with_storage(grown, "1Gi"), grown)) == [
        ("spec.resources.requests.storage", "Forbidden: field can not be less than status.capacity")]
    # Other spec fields stay put, bound or not.
    changed = bound(old)
    changed["spec"]["accessModes"] = ["ReadWriteMany"]
    assert fields(validate_pvc(changed, bound(old)))[0][0] == "spec"
    # A bound claim's volume cannot be swapped.
    other = bound(old)
    other["spec"]["volumeName"] = "pv-2"
    assert fields(validate_pvc(other, bound(old)))[0][0] == "spec"


def test_a_claim_without_class_may_be_given_one_once():
    old = pvc()
    assert "storageClassName" not in old["spec"]
    given = copy.deepcopy(old)
    given["spec"]["storageClassName"] = "local-path"
    assert validate_pvc(given, old) == []  # the PV controller's retroactive default class
    other = copy.deepcopy(given)
    other["spec"]["storageClassName"] = "gold"
    assert fields(validate_pvc(other, given))[0][0] == "spec"  # but never changed after
    empty = pvc(storageClassName="")
    assert fields(validate_pvc(given, empty))[0][0] == "spec"  # "" is a choice, not an absence
    beta = copy.deepcopy(old)
    beta["metadata"]["annotations"] = {"volume.beta.kubernetes.io/storage-class": "x"}
    given_beta = copy.deepcopy(beta)
    given_beta["spec"]["storageClassName"] = "local-path"
    assert fields(validate_pvc(given_beta, beta))[0][0] == "spec"


def cells(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
    return {c.name: c.value(obj) for c in PERSISTENT_VOLUME_CLAIM.table_columns()}


def test_table_columns():
    assert [c.name for c in PERSISTENT_VOLUME_CLAIM.table_columns() if c.priority == 0] == [
        "Name", "Status", "Volume", "Capacity", "Access Modes", "StorageClass", "VolumeAttributesClass", "Age"]
    row = cells(pvc(storageClassName="fast"))
    assert (row["Status"], row["Volume"], row["Capacity"], row["Access Modes"], row["StorageClass"]) == (
        "Pending", "", "", "", "fast")
    row = cells(bound(pvc(accessModes=["ReadOnlyMany", "ReadWriteOnce"]), "5Gi"))
    assert (row["Status"], row["Volume"], row["Capacity"], row["Access Modes"]) == ("Bound", "pv-1", "5Gi", "RWO")
    gone = pvc()
    gone["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert cells(gone)["Status"] == "Terminating"
    assert REG.resolve("pvc") is PERSISTENT_VOLUME_CLAIM


def test_controller_revision():
    rev = {"apiVersion": "apps/v1", "kind": "ControllerRevision",
           "metadata": {"name": "web-abc", "namespace": "ns", "ownerReferences": [
               {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u", "controller": True}]},
           "data": {"spec": {"template": {"$patch": "replace"}}}, "revision": 2}
    assert validate_controller_revision(rev, None) == []
    assert controller_cell(rev) == "statefulset.apps/web"
    changed = copy.deepcopy(rev)
    changed["data"] = {"spec": {}}
    assert fields(validate_controller_revision(changed, rev)) == [
        ("data", 'Invalid value: {"spec":{}}: field is immutable')]
    renumbered = copy.deepcopy(rev)
    renumbered["revision"] = 5
    assert validate_controller_revision(renumbered, rev) == []
    bad = copy.deepcopy(rev)
    del bad["data"]
    bad["revision"] = -1
    assert fields(validate_controller_revision(bad, None)) == [
        ("data", "Required value: data is mandatory"),
        ("revision", "Invalid value: -1: must be greater than or equal to 0")]
    assert controller_cell({"metadata": {}}) == "<none>"


def test_statefulset_may_mount_its_claim_templates():
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": "ns"},
           "spec": {"selector": {"matchLabels": {"app": "web"}}, "serviceName": "web",
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                        {"name": "c", "image": "img", "volumeMounts": [{"name": "data", "mountPath": "/d"},
                                                                       {"name": "nope", "mountPath": "/n"}]}]}},
                    "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}
    apps.default_stateful_set(sts)
    assert fields(apps.validate_stateful_set(sts, None)) == [
        ("spec.template.spec.containers[0].volumeMounts[1].name", 'Not found: "nope"')]
    assert "volumes" not in sts["spec"]["template"]["spec"]  # validation does not change the object
