"""The API objects a pod (or a PersistentVolume) names: Secrets, ConfigMaps, claims.

Kubernetes walks a pod's spec for the objects it refers to in several places —
the Node authorizer (which Secrets and ConfigMaps a node may read), the
NodeRestriction admission plugin (a mirror pod may name none), the kubelet's
managers.  The walk is Kubernetes' `VisitPodSecretNames` / `VisitPodConfigmapNames`
(pkg/api/v1/pod) and `VisitPVSecretNames` (pkg/api/v1/persistentvolume): every
container (init, regular, ephemeral), image pull secrets, env and envFrom, and each
volume source that carries a secret or config map reference.

Pure functions over JSON dicts; a malformed field (a number where a mapping should
be) is skipped, never raised on: these run on stored objects written by anyone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fleet.api.pvmatch import pod_claim_names

# Volume sources whose `secretRef.name` is a Secret in the pod's namespace.
_SECRET_REF_VOLUMES = ("cephfs", "cinder", "flexVolume", "iscsi", "rbd", "scaleIO", "storageos")
# PersistentVolume sources whose secretRef the kubelet reads (VisitPVSecretNames with
# kubeletVisible=true): (source, field).  The CSI controller-side secrets
# (controllerPublishSecretRef, controllerExpandSecretRef) are the external
# attacher's / resizer's, never the node's.
_PV_KUBELET_SECRET_REFS = (
    ("cephfs", "secretRef"), ("cinder", "secretRef"), ("flexVolume", "secretRef"),
    ("iscsi", "secretRef"), ("rbd", "secretRef"), ("scaleIO", "secretRef"),
    ("storageos", "secretRef"),
    ("csi", "nodePublishSecretRef"), ("csi", "nodeStageSecretRef"), ("csi", "nodeExpandSecretRef"),
)
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


def _d(obj: Any, *path: str) -> dict[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _name(ref: Any, field: str = "name") -> str:
    value = ref.get(field) if isinstance(ref, Mapping) else None
    return value if isinstance(value, str) and value else ""


def all_containers(pod: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Init, regular and ephemeral containers (podutil.AllContainers)."""
    spec = _d(pod, "spec")
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in _list(spec.get(field)):
            if isinstance(c, dict):
                yield c


def pod_secret_names(pod: Mapping[str, Any]) -> set[str]:
    """The Secrets (in the pod's namespace) the pod names (VisitPodSecretNames)."""
    out: set[str] = set()
    spec = _d(pod, "spec")
    out.update(_name(r) for r in _list(spec.get("imagePullSecrets")))
    for c in all_containers(pod):
        out.update(_name(_d(e, "secretRef")) for e in _list(c.get("envFrom")))
        out.update(_name(_d(e, "valueFrom", "secretKeyRef")) for e in _list(c.get("env")))
    for v in _list(spec.get("volumes")):
        if not isinstance(v, dict):
            continue
        out.add(_name(_d(v, "secret"), "secretName"))
        out.add(_name(_d(v, "azureFile"), "secretName"))
        for src in _list(_d(v, "projected").get("sources")):
            out.add(_name(_d(src, "secret")))
        for source in _SECRET_REF_VOLUMES:
            out.add(_name(_d(v, source, "secretRef")))
        out.add(_name(_d(v, "csi", "nodePublishSecretRef")))
    out.discard("")
    return out


def pod_configmap_names(pod: Mapping[str, Any]) -> set[str]:
    """The ConfigMaps (in the pod's namespace) the pod names (VisitPodConfigmapNames)."""
    out: set[str] = set()
    for c in all_containers(pod):
        out.update(_name(_d(e, "configMapRef")) for e in _list(c.get("envFrom")))
        out.update(_name(_d(e, "valueFrom", "configMapKeyRef")) for e in _list(c.get("env")))
    for v in _list(_d(pod, "spec").get("volumes")):
        if not isinstance(v, dict):
            continue
        out.add(_name(_d(v, "configMap")))
        for src in _list(_d(v, "projected").get("sources")):
            out.add(_name(_d(src, "configMap")))
    out.discard("")
    return out


def pod_pvc_names(pod: Mapping[str, Any]) -> set[str]:
    """The claims the pod's volumes use, generic ephemeral ones (`<pod>-<volume>`) included."""
    if not isinstance(_d(pod, "spec").get("volumes", []), list):
        return set()
    return set(pod_claim_names(pod))


def pod_resource_claim_names(pod: Mapping[str, Any]) -> set[str]:
    """The ResourceClaims (resource.k8s.io) the pod uses: each `spec.resourceClaims[]`
    entry's `resourceClaimName`, or — for one made from a template — the name the
    controller recorded in `status.resourceClaimStatuses` (resourceclaim.Name).  An
    entry whose claim is not made yet names nothing."""
    made = {_name(s): _name(s, "resourceClaimName")
            for s in _list(_d(pod, "status").get("resourceClaimStatuses"))}
    out: set[str] = set()
    for rc in _list(_d(pod, "spec").get("resourceClaims")):
        direct = _name(rc, "resourceClaimName")
        if direct:
            out.add(direct)
        elif _name(rc, "resourceClaimTemplateName"):
            out.add(made.get(_name(rc), ""))
    ext = _name(_d(pod, "status", "extendedResourceClaimStatus"), "resourceClaimName")
    out.add(ext)
    out.discard("")
    return out


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    return MIRROR_POD_ANNOTATION in _d(pod, "metadata", "annotations")


def pv_kubelet_secret_refs(pv: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(namespace, name) of each Secret a node reads to mount the volume
    (VisitPVSecretNames, kubeletVisible only).  A reference without a namespace is in
    the bound claim's namespace (azureFile's secretNamespace defaults the same way)."""
    spec = _d(pv, "spec")
    claim_ns = _name(_d(spec, "claimRef"), "namespace")
    out: set[tuple[str, str]] = set()
    for source, field in _PV_KUBELET_SECRET_REFS:
        ref = _d(spec, source, field)
        name = _name(ref)
        if name:
            out.add((_name(ref, "namespace") or claim_ns, name))
    azure = _d(spec, "azureFile")
    if _name(azure, "secretName"):
        out.add((_name(azure, "secretNamespace") or claim_ns or "default", azure["secretName"]))
    return {(ns, n) for ns, n in out if ns}


__all__ = ["MIRROR_POD_ANNOTATION", "all_containers", "is_mirror_pod", "pod_configmap_names",
           "pod_pvc_names", "pod_resource_claim_names", "pod_secret_names", "pv_kubelet_secret_refs"]
