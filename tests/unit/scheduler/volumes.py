"""Hand-built PersistentVolumes, claims, classes and CSI objects for the VolumeBinding tests."""

from __future__ import annotations

from typing import Any

from tests.unit.scheduler.factories import HOSTNAME, pod

LOCAL_DRIVER = "local.fleet.dev"


def claim(name: str, *, cls: str | None = "wffc", size: str = "1Gi", volume: str | None = None,
          bound: bool = False, selected_node: str | None = None, namespace: str = "default",
          modes: tuple[str, ...] = ("ReadWriteOnce",), rv: str = "10",
          selector: dict[str, Any] | None = None) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if bound:
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
    if selected_node:
        annotations["volume.kubernetes.io/selected-node"] = selected_node
    spec: dict[str, Any] = {"accessModes": list(modes), "resources": {"requests": {"storage": size}},
                            "volumeMode": "Filesystem"}
    if cls is not None:
        spec["storageClassName"] = cls
    if volume:
        spec["volumeName"] = volume
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "resourceVersion": rv, "annotations": annotations},
            "spec": spec, "status": {"phase": "Bound" if bound else "Pending"}}


def volume(name: str, *, node: str | None = None, cls: str = "wffc", size: str = "1Gi",
           claim_ref: dict[str, Any] | None = None, phase: str = "Available", rv: str = "5",
           labels: dict[str, str] | None = None, zone: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                            "storageClassName": cls, "volumeMode": "Filesystem",
                            "persistentVolumeReclaimPolicy": "Retain", "local": {"path": f"/mnt/{name}"}}
    if node is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": HOSTNAME, "operator": "In", "values": [node]}]}]}}
    if zone is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}]}}
    if claim_ref is not None:
        spec["claimRef"] = claim_ref
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "resourceVersion": rv, "labels": labels or {}},
            "spec": spec, "status": {"phase": phase}}


def ref(c: dict[str, Any]) -> dict[str, Any]:
    md = c["metadata"]
    return {"kind": "PersistentVolumeClaim", "namespace": md["namespace"], "name": md["name"],
            "uid": md["uid"]}


def storage_class(name: str = "wffc", *, provisioner: str = LOCAL_DRIVER, mode: str = "WaitForFirstConsumer",
                  allowed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    sc: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                          "metadata": {"name": name}, "provisioner": provisioner,
                          "volumeBindingMode": mode, "reclaimPolicy": "Delete"}
    if allowed is not None:
        sc["allowedTopologies"] = allowed
    return sc


def csinode(node: str, *drivers: str) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node},
            "spec": {"drivers": [{"name": d, "nodeID": node, "topologyKeys": [HOSTNAME]} for d in drivers]}}


def csidriver(name: str = LOCAL_DRIVER, *, capacity: bool = True) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": name},
            "spec": {"attachRequired": False, "storageCapacity": capacity, "podInfoOnMount": False,
                     "volumeLifecycleModes": ["Persistent"]}}


def capacity(node: str, amount: str | None, *, cls: str = "wffc", max_size: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                           "metadata": {"name": f"csisc-{node}-{cls}", "namespace": "kube-system"},
                           "storageClassName": cls,
                           "nodeTopology": {"matchLabels": {HOSTNAME: node}}}
    if amount is not None:
        obj["capacity"] = amount
    if max_size is not None:
        obj["maximumVolumeSize"] = max_size
    return obj


def claim_pod(*claims: str, name: str = "p", **kw: Any) -> dict[str, Any]:
    return pod(name, volumes=[{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                              for i, c in enumerate(claims)], **kw)
