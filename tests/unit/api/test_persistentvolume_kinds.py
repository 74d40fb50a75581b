"""PersistentVolume (and the PVC status rules): defaults, validation, update rules, table cells."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.persistentvolume import (
    PERSISTENT_VOLUME,
    default_pv,
    prepare_status_update,
    validate_pv,
)
from fleet.api.kinds.storage import default_pvc, validate_pvc
from fleet.api.registry import default_registry

REG = default_registry()
AFFINITY = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}


def pv(name: str = "pv1", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
                            "hostPath": {"path": "/data/pv1"}}
    base.update(spec)
    obj = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
           "spec": {k: v for k, v in base.items() if v is not None}}
    default_pv(obj)
    return obj


def fields(causes: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in causes]


def test_defaults():
    obj = pv()
    assert obj["spec"]["persistentVolumeReclaimPolicy"] == "Retain"  # static volumes are kept
    assert obj["spec"]["volumeMode"] == "Filesystem"
    assert obj["spec"]["hostPath"]["type"] == ""
    assert obj["status"]["phase"] == "Pending" and obj["status"]["lastPhaseTransitionTime"]
    assert validate_pv(obj, None) == []
    # Explicit values are kept.
    explicit = pv(persistentVolumeReclaimPolicy="Delete", volumeMode="Block")
    assert (explicit["spec"]["persistentVolumeReclaimPolicy"], explicit["spec"]["volumeMode"]) == ("Delete", "Block")


NFS = {"server": "10.0.0.1", "path": "/exports/a"}
CSI = {"driver": "local.fleet.dev", "volumeHandle": "vol-1"}


@pytest.mark.parametrize(("spec", "want"), [
    # Exactly one volume source.
    ({"hostPath": None}, [("spec", "Required value: must specify a volume type")]),
    ({"nfs": NFS}, [("spec.nfs", "Forbidden: may not specify more than 1 volume type")]),
    ({"hostPath": None, "nfs": NFS, "csi": CSI}, [("spec.csi", "Forbidden: may not specify more than 1 volume type")]),
    ({"hostPath": None, "nfs": NFS, "cephfs": {"monitors": ["m"]}},
     [("spec.cephFS", "Forbidden: may not specify more than 1 volume type")]),
    # Per source.
    ({"hostPath": {"path": ""}}, [("spec.hostPath.path", "Required value")]),
    ({"hostPath": {"path": "/a/../b"}}, [("spec.hostPath.path", "Invalid value: \"/a/../b\": must not contain '..'")]),
    ({"hostPath": {"path": "/a", "type": "Pipe"}},
     [("spec.hostPath.type", 'Unsupported value: "Pipe": supported values: "", "BlockDevice", "CharDevice", '
                             '"Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"')]),
    ({"hostPath": None, "nfs": {"server": "", "path": "exports"}},
     [("spec.nfs.server", "Required value"),
      ("spec.nfs.path", 'Invalid value: "exports": must be an absolute path')]),
    ({"hostPath": None, "csi": {"driver": "Bad_Driver", "volumeHandle": ""}},
     [("spec.csi.driver", 'Invalid value: "Bad_Driver": a lowercase RFC 1123 subdomain must consist of lower case '
                          "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                          "character (e.g. 'example.com', regex used for validation is "
                          "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
      ("spec.csi.volumeHandle", "Required value")]),
    ({"hostPath": None, "csi": {**CSI, "nodePublishSecretRef": {"name": "s"}}},
     [("spec.csi.nodePublishSecretRef.namespace", "Required value")]),
    ({"hostPath": None, "local": {"path": "/mnt/disk"}},
     [("spec.nodeAffinity", "Required value: Local volume requires node affinity")]),
    ({"hostPath": None, "local": {"path": "/mnt/disk"}, "nodeAffinity": AFFINITY}, []),
    ({"nodeAffinity": {}}, [("spec.nodeAffinity.required", "Required value: must specify required node constraints")]),
    ({"nodeAffinity": {"required": {"nodeSelectorTerms": []}}},
     [("spec.nodeAffinity.required.nodeSelectorTerms", "Required value: must have at least one node selector term")]),
    # Capacity: required, only storage, positive.
    ({"capacity": None}, [("spec.capacity", "Required value"),
                          ("spec.capacity", 'Unsupported value: core.ResourceList(nil): supported values: "storage"')]),
    ({"capacity": {"storage": "5Gi", "cpu": "1"}},
     [("spec.capacity", 'Unsupported value: {"cpu":"1","storage":"5Gi"}: supported values: "storage"')]),
    ({"capacity": {"storage": "0"}}, [("spec.capacity[storage]", 'Invalid value: "0": must be greater than zero')]),
    # Access modes, reclaim policy, class, volume mode.
    ({"accessModes": []}, [("spec.accessModes", "Required value")]),
    ({"accessModes": ["ReadWriteOncePod", "ReadOnlyMany"]},
     [("spec.accessModes", "Forbidden: may not use ReadWriteOncePod with other access modes")]),
    ({"persistentVolumeReclaimPolicy": "Keep"},
     [("spec.persistentVolumeReclaimPolicy",
       'Unsupported value: "Keep": supported values: "Delete", "Recycle", "Retain"')]),
    ({"hostPath": {"path": "/"}, "persistentVolumeReclaimPolicy": "Recycle"},
     [("spec.persistentVolumeReclaimPolicy", "Forbidden: may not be 'recycle' for a hostPath mount of '/'")]),
    ({"storageClassName": "Fast"}, None),
    ({"volumeMode": "Tape"}, [("spec.volumeMode", 'Unsupported value: "Tape": supported values: "Block", "Filesystem"')]),
])
def test_validation(spec, want):
    causes = fields(validate_pv(pv(**spec), None))
    if want is None:
        assert [f for f, _ in causes] == ["spec.storageClassName"]
    else:
        assert causes == want


def test_mount_options_annotation_only_for_plugins_that_take_options():
    obj = pv()
    obj["metadata"]["annotations"] = {"volume.beta.kubernetes.io/mount-options": "ro"}
    assert fields(validate_pv(obj, None)) == [
        ("metadata.annotations.volume.beta.kubernetes.io/mount-options",
         "Forbidden: may not specify mount options for this volume type")]
    obj = pv(hostPath=None, nfs=NFS)
    obj["metadata"]["annotations"] = {"volume.beta.kubernetes.io/mount-options": "ro"}
    assert validate_pv(obj, None) == []


def test_update_rules():
    old = pv(hostPath=None, csi=CSI, nodeAffinity=AFFINITY, storageClassName="fast")
    # The binder writes claimRef; capacity, class, policy and mount options may change.
    ok = copy.deepcopy(old)
    ok["spec"]["claimRef"] = {"namespace": "ns", "name": "data", "uid": "u1"}
    ok["spec"]["capacity"] = {"storage": "10Gi"}
    ok["spec"]["persistentVolumeReclaimPolicy"] = "Delete"
    ok["spec"]["mountOptions"] = ["noatime"]
    assert validate_pv(ok, old) == []
    # A controllerExpandSecretRef may be added later...
    later = copy.deepcopy(old)
    later["spec"]["csi"]["controllerExpandSecretRef"] = {"name": "s", "namespace": "kube-system"}
    assert validate_pv(later, old) == []
    # ... but the source, the volume mode and a set node affinity are fixed.
    moved = copy.deepcopy(old)
    moved["spec"]["csi"]["volumeHandle"] = "vol-2"
    moved["spec"]["volumeMode"] = "Block"
    moved["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["n2"]
    assert [f for f, _ in fields(validate_pv(moved, old))] == ["spec.persistentvolumesource", "volumeMode",
                                                                 "nodeAffinity"]
    assert fields(validate_pv(moved, old))[0][1] == (
        "Forbidden: spec.persistentvolumesource is immutable after creation")
    # Node affinity may be set when there was none.
    bare = pv()
    pinned = copy.deepcopy(bare)
    pinned["spec"]["nodeAffinity"] = AFFINITY
    assert validate_pv(pinned, bare) == []


def test_status_update_restamps_the_phase_transition():
    old = pv()
    old["status"] = {"phase": "Available", "lastPhaseTransitionTime": "2020-01-01T00:00:00Z"}
    same = copy.deepcopy(old)
    del same["status"]["lastPhaseTransitionTime"]
    same["status"]["message"] = "still here"
    prepare_status_update(same, old)
    assert same["status"]["lastPhaseTransitionTime"] == "2020-01-01T00:00:00Z"
    bound = copy.deepcopy(old)
    bound["status"]["phase"] = "Bound"
    prepare_status_update(bound, old)
    assert bound["status"]["lastPhaseTransitionTime"] > "2020-01-01T00:00:00Z"
    chosen = copy.deepcopy(old)
    chosen["status"] = {"phase": "Released", "lastPhaseTransitionTime": "2021-01-01T00:00:00Z"}
    prepare_status_update(chosen, old)
    assert chosen["status"]["lastPhaseTransitionTime"] == "2021-01-01T00:00:00Z"


def cells(obj: dict[str, Any], wide: bool = False) -> dict[str, Any]:
    obj["metadata"].setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
    return {c.name: c.value(obj) for c in PERSISTENT_VOLUME.table_columns() if wide or c.priority == 0}


def test_table():
    assert [c.name for c in PERSISTENT_VOLUME.table_columns()] == [
        "Name", "Capacity", "Access Modes", "Reclaim Policy", "Status", "Claim", "StorageClass",
        "VolumeAttributesClass", "Reason", "Age", "VolumeMode"]
    row = cells(pv(capacity={"storage": "1024Mi"}, accessModes=["ReadWriteMany", "ReadWriteOnce"],
                   storageClassName="manual"))
    assert row == {"Name": "pv1", "Capacity": "1Gi", "Access Modes": "RWO,RWX", "Reclaim Policy": "Retain",
                   "Status": "Pending", "Claim": "", "StorageClass": "manual", "VolumeAttributesClass": "<unset>",
                   "Reason": "", "Age": row["Age"]}
    obj = pv()
    obj["spec"]["claimRef"] = {"namespace": "ns", "name": "data"}
    obj["status"] = {"phase": "Released", "reason": "Reclaimed"}
    obj["metadata"]["annotations"] = {"volume.beta.kubernetes.io/storage-class": "legacy"}
    row = cells(obj, wide=True)
    assert (row["Claim"], row["Status"], row["Reason"], row["StorageClass"], row["VolumeMode"]) == (
        "ns/data", "Released", "Reclaimed", "legacy", "Filesystem")
    obj["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert cells(obj)["Status"] == "Terminating"
    assert REG.resolve("pv") is PERSISTENT_VOLUME


# ---------------------------------------------------------------------------
# PersistentVolumeClaim: what the controllers write, and the update rules
# the storage issue relies on.
# ---------------------------------------------------------------------------


def pvc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    base.update(spec)
    obj = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "ns"},
           "spec": {k: v for k, v in base.items() if v is not None}}
    default_pvc(obj)
    return obj


@pytest.mark.parametrize(("status", "want"), [
    ({"phase": "Bound", "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
      "allocatedResources": {"storage": "2Gi"}, "allocatedResourceStatuses": {"storage": "NodeResizePending"},
      "conditions": [{"type": "FileSystemResizePending", "status": "True"}]}, []),
    ({"phase": "Bound", "capacity": {"storage": "-1"}},
     [("status.capacity[storage]", "Invalid value: -1: must be a valid resource quantity")]),
    ({"phase": "Bound", "allocatedResourceStatuses": {"storage": "Growing"}},
     [("status.allocatedResourceStatus",
       'Unsupported value: "storage": supported values: "ControllerResizeFailed", "ControllerResizeInProgress", '
       '"NodeResizeFailed", "NodeResizeInProgress", "NodeResizePending"')]),
    ({"phase": "Bound", "allocatedResources": {"cpu": "1"}},
     [("status.allocatedResources", 'Unsupported value: "cpu": supported values: "storage"')]),
    ({"phase": "Bound", "allocatedResources": {"example.com/iops": "100"}}, []),
    ({"phase": "Gone"}, [("status.phase", 'Unsupported value: "Gone": supported values: "Bound", "Lost", "Pending"')]),
])
def test_claim_status(status, want):
    obj = pvc()
    obj["status"] = status
    assert fields(validate_pvc(obj, None)) == want


def test_claim_class_may_be_set_once_when_never_set():
    old = pvc()
    assert "storageClassName" not in old["spec"]
    given = copy.deepcopy(old)
    given["spec"]["storageClassName"] = "local-path"  # the retroactive default class
    assert validate_pvc(given, old) == []
    # An explicit class (even "") is fixed.
    empty = pvc(storageClassName="")
    changed = copy.deepcopy(empty)
    changed["spec"]["storageClassName"] = "local-path"
    assert [f for f, _ in fields(validate_pvc(changed, empty))] == ["spec"]
    # The beta annotation's class may move into the field, not another one.
    annotated = pvc()
    annotated["metadata"]["annotations"] = {"volume.beta.kubernetes.io/storage-class": "gold"}
    moved = copy.deepcopy(annotated)
    moved["spec"]["storageClassName"] = "gold"
    assert validate_pvc(moved, annotated) == []
    other = copy.deepcopy(annotated)
    other["spec"]["storageClassName"] = "silver"
    assert [f for f, _ in fields(validate_pvc(other, annotated))] == ["spec"]


def test_claim_shrink_and_volume_mode():
    old = pvc()
    old["spec"]["volumeName"] = "pv1"
    old["status"] = {"phase": "Bound", "capacity": {"storage": "2Gi"}}
    old["spec"]["resources"]["requests"]["storage"] = "3Gi"
    # Back to just above what was provisioned (recovering from a failed expansion): allowed.
    retreat = copy.deepcopy(old)
    retreat["spec"]["resources"]["requests"]["storage"] = "2500Mi"
    assert validate_pvc(retreat, old) == []
    shrink = copy.deepcopy(old)
    shrink["spec"]["resources"]["requests"]["storage"] = "1Gi"
    assert fields(validate_pvc(shrink, old)) == [
        ("spec.resources.requests.storage", "Forbidden: field can not be less than status.capacity")]
    block = copy.deepcopy(old)
    block["spec"]["volumeMode"] = "Block"
    assert [f for f, _ in fields(validate_pvc(block, old))] == ["spec", "volumeMode"]
