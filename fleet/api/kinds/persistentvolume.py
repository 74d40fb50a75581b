"""The core (`v1`) PersistentVolume: a piece of storage, cluster-scoped, bound to at most one claim.

A volume is made by an administrator (a *static* volume: `hostPath`, `local`,
`nfs`, `csi`, ...) or by a provisioner for a claim (a *dynamic* volume, always
`csi` in Fleet).  The PV controller binds claims to volumes through
`spec.claimRef` and writes the phase (`Pending` → `Available` → `Bound` →
`Released`/`Failed`) through `/status`; everything here is what kube-apiserver
does with the object itself, so those controllers see the same answers they
would from Kubernetes 1.32:

* defaulting is `SetDefaults_PersistentVolume` (reclaim policy `Retain`,
  volume mode `Filesystem`, phase `Pending`) plus `hostPath.type: ""`; the
  strategy's `PrepareForCreate` stamps `status.lastPhaseTransitionTime`, and a
  `/status` write that changes the phase restamps it (`prepare_status_update`);
* validation is `ValidatePersistentVolume[Spec|Update]` of
  pkg/apis/core/validation with its field paths and words: exactly one volume
  source (counted over every source Kubernetes knows; `csi`, `hostPath`,
  `local` and `nfs` are checked field by field, being the ones Fleet can
  serve), a positive `capacity[storage]` and nothing else, access modes,
  reclaim policy, node affinity (required for `local`), class name, volume
  mode; after creation the source, the volume mode and a set node affinity
  are immutable (kube's odd paths `spec.persistentvolumesource`,
  `volumeMode` and `nodeAffinity` included).  `claimRef` is not validated,
  exactly as upstream: the binder owns it;
* the table is kubectl's `printPersistentVolume`.

`validate_pv_spec(..., inline=True)` is the inline-volume variant that a
VolumeAttachment's `spec.source.inlineVolumeSpec` uses.
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.errors import cause
from fleet.api.kinds._common import col, d, set_default, table
from fleet.api.kinds.pod_validation import validate_node_selector
from fleet.api.kinds.storage import (
    BETA_STORAGE_CLASS_ANNOTATION,
    VOLUME_MODES,
    access_modes_string,
    canonical_quantity,
    validate_access_modes,
)
from fleet.api.quantity import QuantityError, parse_quantity
from fleet.api.registry import KindInfo

Cause = dict[str, str]

RECLAIM_POLICIES = ("Delete", "Recycle", "Retain")  # sets.List: sorted
PHASES = ("Available", "Bound", "Failed", "Pending", "Released")
HOST_PATH_TYPES = ("", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File",
                   "FileOrCreate", "Socket")
MOUNT_OPTIONS_ANNOTATION = "volume.beta.kubernetes.io/mount-options"
# The PersistentVolumeSource fields, in the order ValidatePersistentVolumeSpec counts them, each
# with the path its "more than 1 volume type" error names (kube's spellings, `cephFS` included).
VOLUME_SOURCES = (
    ("hostPath", "hostPath"), ("gcePersistentDisk", "gcePersistentDisk"),
    ("awsElasticBlockStore", "awsElasticBlockStore"), ("glusterfs", "glusterfs"), ("flocker", "flocker"),
    ("nfs", "nfs"), ("rbd", "rbd"), ("quobyte", "quobyte"), ("cephfs", "cephFS"), ("iscsi", "iscsi"),
    ("cinder", "cinder"), ("fc", "fc"), ("flexVolume", None), ("azureFile", "azureFile"),
    ("vsphereVolume", "vsphereVolume"), ("photonPersistentDisk", "photonPersistentDisk"),
    ("portworxVolume", "portworxVolume"), ("azureDisk", "azureDisk"), ("scaleIO", "scaleIO"),
    ("local", "local"), ("storageos", "storageos"), ("csi", "csi"),
)
SOURCE_FIELDS = tuple(name for name, _ in VOLUME_SOURCES)
# Volume types whose plugins take mount options (pkg/volume/validation checkMountOption).
_MOUNT_OPTION_SOURCES = ("gcePersistentDisk", "awsElasticBlockStore", "glusterfs", "nfs", "rbd", "quobyte",
                         "iscsi", "cinder", "cephfs", "azureFile", "vsphereVolume", "azureDisk",
                         "photonPersistentDisk")
NOT_POSITIVE = "must be greater than zero"
SOURCE_IMMUTABLE = "spec.persistentvolumesource is immutable after creation"


# ---------------------------------------------------------------------------
# Defaulting.
# ---------------------------------------------------------------------------


def default_pv(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        set_default(spec, "persistentVolumeReclaimPolicy", "Retain")
        set_default(spec, "volumeMode", "Filesystem")
        host_path = spec.get("hostPath")
        if isinstance(host_path, dict):
            set_default(host_path, "type", "")
    status = obj.get("status")
    if status is None:
        # A new volume (the write path drops a client's status on create): the
        # strategy's PrepareForCreate makes it Pending as of now.
        obj["status"] = {"phase": "Pending", "lastPhaseTransitionTime": meta.now_rfc3339()}
    elif isinstance(status, dict):
        set_default(status, "phase", "Pending")


def prepare_status_update(new: dict[str, Any], old: dict[str, Any]) -> None:
    """persistentvolumeStatusStrategy.PrepareForUpdate: keep the transition time while
    the phase stays; stamp now when it changes and the writer did not set a new one."""
    status = new.get("status")
    if not isinstance(status, dict):
        return
    old_status = d(old, "status")
    stamp = status.get("lastPhaseTransitionTime")
    if status.get("phase") == old_status.get("phase"):
        if stamp is None and old_status.get("lastPhaseTransitionTime") is not None:
            status["lastPhaseTransitionTime"] = old_status["lastPhaseTransitionTime"]
    elif stamp is None or stamp == old_status.get("lastPhaseTransitionTime"):
        status["lastPhaseTransitionTime"] = meta.now_rfc3339()


# ---------------------------------------------------------------------------
# Validation.
# ---------------------------------------------------------------------------


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _path_no_backsteps(value: str, path: str) -> list[Cause]:
    """validatePathNoBacksteps."""
    if ".." in value.split("/"):
        return [v.invalid(path, value, "must not contain '..'")]
    return []


def validate_csi_driver_name(name: Any, path: str) -> list[Cause]:
    """core ValidateCSIDriverName: required, at most 63 characters, a DNS subdomain (any case)."""
    name = _str(name)
    out: list[Cause] = []
    if not name:
        out.append(v.required(path))
    if len(name) > 63:
        out.append(v.too_long(path, 63))
    out += [v.invalid(path, name, msg) for msg in v.is_dns1123_subdomain(name.lower())]
    return out


def _secret_ref_errors(ref: Any, path: str) -> list[Cause]:
    """validatePVSecretReference: a name (DNS subdomain) and a namespace (DNS label)."""
    ref = ref if isinstance(ref, dict) else {}
    out: list[Cause] = []
    name, ns = _str(ref.get("name")), _str(ref.get("namespace"))
    if not name:
        out.append(v.required(f"{path}.name"))
    else:
        out += [v.invalid(f"{path}.name", name, m) for m in v.is_dns1123_subdomain(name)]
    if not ns:
        out.append(v.required(f"{path}.namespace"))
    else:
        out += [v.invalid(f"{path}.namespace", ns, m) for m in v.is_dns1123_label(ns)]
    return out


def _csi_errors(csi: dict[str, Any], path: str) -> list[Cause]:
    out = validate_csi_driver_name(csi.get("driver"), f"{path}.driver")
    if not _str(csi.get("volumeHandle")):
        out.append(v.required(f"{path}.volumeHandle"))
    for key in ("controllerPublishSecretRef", "controllerExpandSecretRef", "nodePublishSecretRef",
                "nodeExpandSecretRef", "nodeStageSecretRef"):
        if csi.get(key) is not None:
            out += _secret_ref_errors(csi[key], f"{path}.{key}")
    return out


def _host_path_errors(hp: dict[str, Any], path: str) -> list[Cause]:
    value = _str(hp.get("path"))
    if not value:
        return [v.required(f"{path}.path")]
    out = _path_no_backsteps(value, f"{path}.path")
    kind = hp.get("type")
    if kind is not None and kind not in HOST_PATH_TYPES:
        out.append(v.not_supported(f"{path}.type", kind, HOST_PATH_TYPES))
    return out


def _local_errors(local: dict[str, Any], path: str) -> list[Cause]:
    value = _str(local.get("path"))
    if not value:
        return [v.required(f"{path}.path")]
    return _path_no_backsteps(value, f"{path}.path")


def _nfs_errors(nfs: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    if not _str(nfs.get("server")):
        out.append(v.required(f"{path}.server"))
    value = _str(nfs.get("path"))
    if not value:
        out.append(v.required(f"{path}.path"))
    if not posixpath.isabs(value):
        out.append(v.invalid(f"{path}.path", value, "must be an absolute path"))
    return out


_SOURCE_CHECKS = {"csi": _csi_errors, "hostPath": _host_path_errors, "local": _local_errors, "nfs": _nfs_errors}


def _capacity_errors(capacity: Any, path: str) -> list[Cause]:
    """Required, exactly `storage`, and a positive quantity."""
    out: list[Cause] = []
    cap = capacity if isinstance(capacity, dict) else {}
    if not cap:
        out.append(v.required(path))
    if "storage" not in cap or len(cap) > 1:
        shown = "core.ResourceList(nil)" if capacity is None else (
            "core.ResourceList{}" if not cap else v.go_value(cap))
        out.append(cause(path, f'Unsupported value: {shown}: supported values: "storage"', "FieldValueNotSupported"))
    for name, raw in cap.items():
        rpath = f"{path}[{name}]"
        try:
            q = parse_quantity(raw)
        except (QuantityError, TypeError, ValueError):
            continue  # the type check reports it
        if q < 0:
            out.append(v.invalid(rpath, int(q), "must be a valid resource quantity"))
        if q <= 0:
            out.append(v.invalid(rpath, canonical_quantity(raw), NOT_POSITIVE))
    return out


def _node_affinity_errors(affinity: Any, path: str) -> list[Cause]:
    """validateVolumeNodeAffinity."""
    if not isinstance(affinity, dict) or affinity.get("required") is None:
        return [v.required(f"{path}.required", "must specify required node constraints")]
    return validate_node_selector(affinity["required"], f"{path}.required")


def validate_pv_spec(spec: Any, path: str = "spec", *, inline: bool = False) -> list[Cause]:
    """ValidatePersistentVolumeSpec (`inline`: validateInlinePersistentVolumeSpec)."""
    if not isinstance(spec, dict):
        return [v.required(path) if spec is None else v.type_invalid(path, spec, "object")]
    out: list[Cause] = []
    if inline:
        if spec.get("claimRef") is not None:
            out.append(v.forbidden(f"{path}.claimRef", "may not be specified in the context of inline volumes"))
        if spec.get("capacity"):
            out.append(v.forbidden(f"{path}.capacity", "may not be specified in the context of inline volumes"))
        if spec.get("csi") is None:
            out.append(v.required(f"{path}.csi", "has to be specified in the context of inline volumes"))
    modes = spec.get("accessModes")
    out += validate_access_modes(modes if isinstance(modes, list) else [], f"{path}.accessModes")
    if not inline:
        out += _capacity_errors(spec.get("capacity"), f"{path}.capacity")
    policy = spec.get("persistentVolumeReclaimPolicy")
    if policy:
        if inline:
            if policy != "Retain":
                out.append(v.forbidden(f"{path}.persistentVolumeReclaimPolicy",
                                       "may only be Retain in the context of inline volumes"))
        elif policy not in RECLAIM_POLICIES:
            out.append(v.not_supported(f"{path}.persistentVolumeReclaimPolicy", policy, RECLAIM_POLICIES))
    affinity_set = False
    if spec.get("nodeAffinity") is not None:
        if inline:
            out.append(v.forbidden(f"{path}.nodeAffinity", "may not be specified in the context of inline volumes"))
        else:
            affinity_set = True
            out += _node_affinity_errors(spec["nodeAffinity"], f"{path}.nodeAffinity")
    count = 0
    for name, forbidden_path in VOLUME_SOURCES:
        src = spec.get(name)
        if src is None:
            continue
        if count > 0 and forbidden_path is not None:
            out.append(v.forbidden(f"{path}.{forbidden_path}", "may not specify more than 1 volume type"))
            continue
        count += 1
        check = _SOURCE_CHECKS.get(name)
        if check is not None and isinstance(src, dict):
            out += check(src, f"{path}.{name}")
        if name == "local" and not affinity_set:
            out.append(v.required(f"{path}.nodeAffinity", "Local volume requires node affinity"))
    if count == 0:
        out.append(v.required(path, "must specify a volume type"))
    host_path = spec.get("hostPath")
    if isinstance(host_path, dict) and posixpath.normpath(_str(host_path.get("path")) or ".") == "/" \
            and policy == "Recycle":
        out.append(v.forbidden(f"{path}.persistentVolumeReclaimPolicy",
                               "may not be 'recycle' for a hostPath mount of '/'"))
    cls = spec.get("storageClassName")
    if cls:
        if inline:
            out.append(v.forbidden(f"{path}.storageClassName",
                                   "may not be specified in the context of inline volumes"))
        else:
            out += [v.invalid(f"{path}.storageClassName", cls, m) for m in v.is_dns1123_subdomain(_str(cls))]
    mode = spec.get("volumeMode")
    if mode is not None:
        if inline:
            if mode != "Filesystem":
                out.append(v.forbidden(f"{path}.volumeMode", "may not specify volumeMode other than Filesystem "
                                       "in the context of inline volumes"))
        elif mode not in VOLUME_MODES:
            out.append(v.not_supported(f"{path}.volumeMode", mode, VOLUME_MODES))
    return out


def _source(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: spec[k] for k in SOURCE_FIELDS if spec.get(k) is not None}


def _validate_update(obj: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """ValidatePersistentVolumeUpdate's immutability rules."""
    out: list[Cause] = []
    new_spec, old_spec = d(obj, "spec"), d(old, "spec")
    new_source, old_source = copy.deepcopy(_source(new_spec)), _source(old_spec)
    new_csi, old_csi = new_source.get("csi"), old_source.get("csi")
    if isinstance(new_csi, dict) and isinstance(old_csi, dict) and old_csi.get("controllerExpandSecretRef") is None:
        # A controllerExpandSecretRef may be added later.
        new_csi.pop("controllerExpandSecretRef", None)
    if new_source != old_source:
        out.append(v.forbidden("spec.persistentvolumesource", SOURCE_IMMUTABLE))
    out += v.immutable(new_spec.get("volumeMode"), old_spec.get("volumeMode"), "volumeMode")
    if old_spec.get("nodeAffinity") is not None:
        out += v.immutable(new_spec.get("nodeAffinity"), old_spec.get("nodeAffinity"), "nodeAffinity")
    if new_spec.get("volumeAttributesClassName") != old_spec.get("volumeAttributesClassName"):
        # The VolumeAttributesClass feature gate is off in Kubernetes 1.32.
        out.append(v.forbidden("spec.volumeAttributesClassName",
                               "update is forbidden when the VolumeAttributesClass feature gate is disabled"))
    return out


def _mount_option_errors(obj: dict[str, Any]) -> list[Cause]:
    """pkg/volume/validation: the legacy mount-options annotation only for plugins that take options."""
    spec = d(obj, "spec")
    if any(spec.get(k) is not None for k in _MOUNT_OPTION_SOURCES):
        return []
    if MOUNT_OPTIONS_ANNOTATION in d(obj, "metadata", "annotations"):
        return [v.forbidden(f"metadata.annotations.{MOUNT_OPTIONS_ANNOTATION}",
                            "may not specify mount options for this volume type")]
    return []


def validate_pv(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    out += validate_pv_spec(obj.get("spec"))
    out += _mount_option_errors(obj)
    if old is not None and isinstance(obj.get("spec"), dict):
        out += _validate_update(obj, old)
    return out


# ---------------------------------------------------------------------------
# Table (printPersistentVolume).
# ---------------------------------------------------------------------------


def volume_class(obj: dict[str, Any]) -> str:
    """GetPersistentVolumeClass: the beta annotation wins over storageClassName."""
    ann = d(obj, "metadata", "annotations").get(BETA_STORAGE_CLASS_ANNOTATION)
    if ann is not None:
        return str(ann)
    return _str(d(obj, "spec").get("storageClassName"))


def capacity_cell(obj: dict[str, Any]) -> str:
    raw = d(obj, "spec", "capacity").get("storage")
    return canonical_quantity(raw) if raw is not None else "0"


def claim_cell(obj: dict[str, Any]) -> str:
    ref = d(obj, "spec").get("claimRef")
    if not isinstance(ref, dict):
        return ""
    return f"{_str(ref.get('namespace'))}/{_str(ref.get('name'))}"


def phase_cell(obj: dict[str, Any]) -> str:
    if d(obj, "metadata").get("deletionTimestamp"):
        return "Terminating"
    return _str(d(obj, "status").get("phase"))


PERSISTENT_VOLUME = KindInfo(
    group="", version="v1", kind="PersistentVolume", plural="persistentvolumes",
    singular="persistentvolume", namespaced=False, short_names=("pv",), subresources=("status",),
    columns_override=table(
        col("Capacity", capacity_cell, description="capacity is the description of the persistent volume's "
            "resources and capacity."),
        col("Access Modes", lambda o: access_modes_string(d(o, "spec").get("accessModes")),
            description="accessModes contains all ways the volume can be mounted."),
        col("Reclaim Policy", lambda o: _str(d(o, "spec").get("persistentVolumeReclaimPolicy")),
            description="persistentVolumeReclaimPolicy defines what happens to a persistent volume when "
            "released from its claim."),
        col("Status", phase_cell, description="phase indicates if a volume is available, bound to a claim, or "
            "released by a claim."),
        col("Claim", claim_cell, description="claimRef is part of a bi-directional binding between "
            "PersistentVolume and PersistentVolumeClaim."),
        col("StorageClass", volume_class, description="StorageClass of the pv"),
        col("VolumeAttributesClass", lambda o: _str(d(o, "spec").get("volumeAttributesClassName")) or "<unset>",
            description="VolumeAttributesClass of the pv"),
        col("Reason", lambda o: _str(d(o, "status").get("reason")),
            description="reason is a brief CamelCase string that describes any failure and is meant for "
            "machine parsing and tidy display in the CLI."),
        wide=(col("VolumeMode", lambda o: _str(d(o, "spec").get("volumeMode")) or "<unset>", priority=1,
                  description="volumeMode defines if a volume is intended to be used with a formatted "
                  "filesystem or to remain in raw block state."),),
    ),
    default=default_pv, validate=validate_pv, prepare_status_update=prepare_status_update,
)

KINDS = (PERSISTENT_VOLUME,)

__all__ = ["KINDS", "PERSISTENT_VOLUME", "PHASES", "RECLAIM_POLICIES", "validate_csi_driver_name",
           "validate_pv_spec", "volume_class"]
