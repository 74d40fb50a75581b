"""storage.k8s.io/v1: StorageClass, CSIDriver, CSINode, CSIStorageCapacity, VolumeAttachment —
defaults, validation (create and update) and the tables kubectl prints."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.csi import (
    CSI_DRIVER,
    CSI_NODE,
    CSI_STORAGE_CAPACITY,
    VOLUME_ATTACHMENT,
    default_csi_driver,
    validate_csi_driver,
    validate_csi_node,
    validate_csi_storage_capacity,
    validate_volume_attachment,
)
from fleet.api.kinds.storageclass import (
    STORAGE_CLASS,
    default_storage_class,
    validate_storage_class,
)
from fleet.api.registry import default_registry

REG = default_registry()


def fields(causes: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in causes]


def cells(info: Any, obj: dict[str, Any]) -> list[Any]:
    obj["metadata"].setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
    return [c.value(obj) for c in info.table_columns() if c.priority == 0]


def headers(info: Any) -> list[str]:
    return [c.name for c in info.table_columns() if c.priority == 0]


# ---------------------------------------------------------------------------
# StorageClass
# ---------------------------------------------------------------------------


def sc(name: str = "fast", **fields_: Any) -> dict[str, Any]:
    obj = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
           "provisioner": "local.fleet.dev", **fields_}
    default_storage_class(obj)
    return obj


def test_storage_class_defaults():
    obj = sc()
    assert (obj["reclaimPolicy"], obj["volumeBindingMode"]) == ("Delete", "Immediate")
    assert validate_storage_class(obj, None) == []
    assert REG.resolve("sc") is STORAGE_CLASS


@pytest.mark.parametrize(("extra", "want"), [
    ({"provisioner": ""}, [("provisioner", "Required value")]),
    ({"provisioner": "not a name!"},
     [("provisioner", 'Invalid value: "not a name!": name part must consist of alphanumeric characters, \'-\', '
                      "'_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
                      "'my.name',  or '123-abc', regex used for validation is "
                      "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")]),
    ({"reclaimPolicy": "Recycle"},
     [("reclaimPolicy", 'Unsupported value: "Recycle": supported values: "Delete", "Retain"')]),
    ({"volumeBindingMode": "Later"},
     [("volumeBindingMode", 'Unsupported value: "Later": supported values: "Immediate", "WaitForFirstConsumer"')]),
    ({"parameters": {"": "x"}}, [("parameters", 'Invalid value: "": field can not be empty.')]),
    ({"parameters": {f"k{i}": "v" for i in range(513)}},
     [("parameters", "Too long: may not be more than 512 bytes")]),
    ({"allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": []}]}]},
     [("allowedTopologies[0].matchLabelExpressions[0].values", "Required value")]),
    ({"allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["a", "a"]}]},
                            {"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}]},
     [("allowedTopologies[0].matchLabelExpressions[0].values[1]", 'Duplicate value: "a"'),
      ("allowedTopologies[1].matchLabelExpressions", 'Duplicate value: ""')]),
])
def test_storage_class_validation(extra, want):
    assert fields(validate_storage_class(sc(**extra), None)) == want


def test_storage_class_update_rules():
    old = sc(parameters={"csi.storage.k8s.io/fstype": "ext4"}, reclaimPolicy="Retain",
             volumeBindingMode="WaitForFirstConsumer")
    ok = copy.deepcopy(old)
    ok["allowVolumeExpansion"] = True
    ok["mountOptions"] = ["noatime"]
    ok["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    assert validate_storage_class(ok, old) == []
    changed = copy.deepcopy(old)
    changed["parameters"] = {"csi.storage.k8s.io/fstype": "xfs"}
    changed["provisioner"] = "hostpath.fleet.dev"
    changed["reclaimPolicy"] = "Delete"
    changed["volumeBindingMode"] = "Immediate"
    assert fields(validate_storage_class(changed, old)) == [
        ("parameters", "Forbidden: updates to parameters are forbidden."),
        ("provisioner", "Forbidden: updates to provisioner are forbidden."),
        ("reclaimPolicy", "Forbidden: updates to reclaimPolicy are forbidden."),
        ("volumeBindingMode", 'Invalid value: "Immediate": field is immutable')]
    # No parameters and empty parameters are the same.
    bare = sc()
    empty = copy.deepcopy(bare)
    empty["parameters"] = {}
    assert validate_storage_class(empty, bare) == []


def test_storage_class_table():
    assert headers(STORAGE_CLASS) == ["Name", "Provisioner", "ReclaimPolicy", "VolumeBindingMode",
                                      "AllowVolumeExpansion", "Age"]
    default = sc("local-path", allowVolumeExpansion=True, volumeBindingMode="WaitForFirstConsumer")
    default["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    assert cells(STORAGE_CLASS, default)[:5] == ["local-path (default)", "local.fleet.dev", "Delete",
                                                 "WaitForFirstConsumer", True]
    beta = sc("old")
    beta["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "false",
                                       "storageclass.beta.kubernetes.io/is-default-class": "true"}
    assert cells(STORAGE_CLASS, beta)[0] == "old (default)"
    # Only the exact string "true" marks the default.
    loud = sc("loud")
    loud["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "True"}
    assert cells(STORAGE_CLASS, loud)[:5] == ["loud", "local.fleet.dev", "Delete", "Immediate", False]
    raw = {"metadata": {"name": "raw"}, "provisioner": "x"}
    assert cells(STORAGE_CLASS, raw)[:5] == ["raw", "x", "Delete", "Immediate", False]


# ---------------------------------------------------------------------------
# CSIDriver
# ---------------------------------------------------------------------------


def driver(**spec: Any) -> dict[str, Any]:
    obj = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "local.fleet.dev"},
           "spec": dict(spec)}
    default_csi_driver(obj)
    return obj


def test_csi_driver_defaults_and_table():
    obj = driver()
    assert obj["spec"] == {"attachRequired": True, "podInfoOnMount": False, "storageCapacity": False,
                           "fsGroupPolicy": "ReadWriteOnceWithFSType", "volumeLifecycleModes": ["Persistent"],
                           "requiresRepublish": False, "seLinuxMount": False}
    assert validate_csi_driver(obj, None) == []
    assert headers(CSI_DRIVER) == ["Name", "AttachRequired", "PodInfoOnMount", "StorageCapacity", "TokenRequests",
                                   "RequiresRepublish", "Modes", "Age"]
    assert cells(CSI_DRIVER, obj)[:7] == ["local.fleet.dev", True, False, False, "<unset>", False, "Persistent"]
    tokens = driver(attachRequired=False, storageCapacity=True, volumeLifecycleModes=["Persistent", "Ephemeral"],
                    tokenRequests=[{"audience": "a"}, {"audience": "b"}])
    assert cells(CSI_DRIVER, tokens)[:7] == ["local.fleet.dev", False, False, True, "a,b", False,
                                             "Persistent,Ephemeral"]


@pytest.mark.parametrize(("spec", "want"), [
    ({"fsGroupPolicy": "Sometimes"},
     [("spec.fsGroupPolicy", 'Unsupported value: "Sometimes": supported values: "File", "None", '
                             '"ReadWriteOnceWithFSType"')]),
    ({"volumeLifecycleModes": ["Forever"]},
     [("spec.volumeLifecycleModes", 'Unsupported value: "Forever": supported values: "Persistent", "Ephemeral"')]),
    ({"tokenRequests": [{"audience": "a", "expirationSeconds": 60}, {"audience": "a"}]},
     [("spec.tokenRequests[0].expirationSeconds", "Invalid value: 60: may not specify a duration less than 10 minutes"),
      ("spec.tokenRequests[1].audience", 'Duplicate value: "a"')]),
])
def test_csi_driver_validation(spec, want):
    assert fields(validate_csi_driver(driver(**spec), None)) == want


def test_csi_driver_update_rules():
    old = driver()
    ok = copy.deepcopy(old)
    ok["spec"]["storageCapacity"] = True
    ok["spec"]["podInfoOnMount"] = True
    assert validate_csi_driver(ok, old) == []
    changed = copy.deepcopy(old)
    changed["spec"]["attachRequired"] = False
    changed["spec"]["volumeLifecycleModes"] = ["Ephemeral"]
    assert fields(validate_csi_driver(changed, old)) == [
        ("spec.attachedRequired", "Invalid value: false: field is immutable"),
        ("spec.volumeLifecycleModes", 'Invalid value: ["Ephemeral"]: field is immutable')]


# ---------------------------------------------------------------------------
# CSINode
# ---------------------------------------------------------------------------


def csinode(*drivers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n1"},
            "spec": {"drivers": list(drivers)}}


LOCAL = {"name": "local.fleet.dev", "nodeID": "n1", "topologyKeys": ["kubernetes.io/hostname"]}


def test_csi_node():
    obj = csinode(LOCAL, {"name": "hostpath.fleet.dev", "nodeID": "n1", "allocatable": {"count": 10}})
    assert validate_csi_node(obj, None) == []
    assert headers(CSI_NODE) == ["Name", "Drivers", "Age"]
    assert cells(CSI_NODE, obj)[:2] == ["n1", 2]
    bad = csinode(LOCAL, {"name": "local.fleet.dev", "nodeID": "", "topologyKeys": ["zone", "zone"],
                          "allocatable": {"count": -1}})
    assert fields(validate_csi_node(bad, None)) == [
        ("spec.drivers[1].nodeID", "Required value"),
        ("spec.drivers[1].allocatable.count", "Invalid value: -1: must be greater than or equal to 0"),
        ("spec.drivers[1].name", 'Duplicate value: "local.fleet.dev"'),
        ("spec.drivers[1]", 'Duplicate value: "zone"')]
    # Drivers come and go as whole entries; a registered one is fixed.
    grown = csinode(LOCAL, {"name": "other.example.com", "nodeID": "x"})
    assert validate_csi_node(grown, csinode(LOCAL)) == []
    moved = csinode({**LOCAL, "nodeID": "n2"})
    assert [f for f, _ in fields(validate_csi_node(moved, csinode(LOCAL)))] == ["spec.drivers"]


# ---------------------------------------------------------------------------
# CSIStorageCapacity
# ---------------------------------------------------------------------------


def capacity(**extra: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {"name": "csisc-abc", "namespace": "kube-system"}, "storageClassName": "fleet-local",
            "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": "n1"}}, **extra}


def test_csi_storage_capacity():
    obj = capacity(capacity="10240Mi", maximumVolumeSize="5Gi")
    assert validate_csi_storage_capacity(obj, None) == []
    # No AGE column (printers.go).
    assert headers(CSI_STORAGE_CAPACITY) == ["Name", "StorageClassName", "Capacity"]
    assert cells(CSI_STORAGE_CAPACITY, obj) == ["csisc-abc", "fleet-local", "10Gi"]
    assert cells(CSI_STORAGE_CAPACITY, capacity())[2] == "<unset>"
    assert fields(validate_csi_storage_capacity(capacity(capacity="-1", storageClassName="Bad"), None))[1] == (
        "capacity", 'Invalid value: "-1": must be greater than or equal to 0')
    # Capacity changes, what it describes does not.
    newer = capacity(capacity="1Gi")
    assert validate_csi_storage_capacity(newer, obj) == []
    moved = capacity(storageClassName="other", nodeTopology={"matchLabels": {"kubernetes.io/hostname": "n2"}})
    assert fields(validate_csi_storage_capacity(moved, obj)) == [
        ("nodeTopology", 'Invalid value: {"matchLabels":{"kubernetes.io/hostname":"n2"}}: field is immutable'),
        ("storageClassName", 'Invalid value: "other": field is immutable')]


# ---------------------------------------------------------------------------
# VolumeAttachment
# ---------------------------------------------------------------------------


def attachment(**source: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "csi-123"},
            "spec": {"attacher": "local.fleet.dev", "nodeName": "n1",
                     "source": source or {"persistentVolumeName": "pvc-1"}}}


def test_volume_attachment():
    obj = attachment()
    assert validate_volume_attachment(obj, None) == []
    assert headers(VOLUME_ATTACHMENT) == ["Name", "Attacher", "PV", "Node", "Attached", "Age"]
    assert cells(VOLUME_ATTACHMENT, obj)[:5] == ["csi-123", "local.fleet.dev", "pvc-1", "n1", False]
    # The attacher reports through status; the spec is fixed.
    done = copy.deepcopy(obj)
    done["status"] = {"attached": True, "attachmentMetadata": {"devicePath": "/dev/loop3"}}
    assert validate_volume_attachment(done, obj) == []
    assert cells(VOLUME_ATTACHMENT, done)[4] is True
    moved = copy.deepcopy(obj)
    moved["spec"]["nodeName"] = "n2"
    assert [f for f, _ in fields(validate_volume_attachment(moved, obj))] == ["spec"]


@pytest.mark.parametrize(("source", "status", "want"), [
    ({"persistentVolumeName": None}, {},
     [("spec.source", "Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName")]),
    ({"persistentVolumeName": "a", "inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"},
                                                       "accessModes": ["ReadWriteOnce"]}}, {},
     [("spec.source", "Forbidden: must specify exactly one of inlineVolumeSpec and persistentVolumeName")]),
    ({"persistentVolumeName": ""}, {},
     [("spec.source.persistentVolumeName", "Required value: must specify non empty persistentVolumeName")]),
    ({"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                           "csi": {"driver": "d.example.com", "volumeHandle": "h"}}}, {},
     [("spec.source.inlineVolumeSpec.capacity", "Forbidden: may not be specified in the context of inline volumes")]),
    ({"persistentVolumeName": "pvc-1"}, {"attachError": {"message": "x", "errorCode": -1}},
     [("status.attachError.errorCode", "Invalid value: -1: must be between 0 and 2147483647, inclusive")]),
])
def test_volume_attachment_validation(source, status, want):
    obj = attachment(**{k: v for k, v in source.items()})
    if source.get("persistentVolumeName") is None and "inlineVolumeSpec" not in source:
        obj["spec"]["source"] = {}
    obj["status"] = status
    assert fields(validate_volume_attachment(obj, None)) == want
