"""The core (`v1`) PersistentVolumeClaim, and the access-mode helpers volumes share.

A claim is a request for storage ("10Gi, ReadWriteOnce, class fast"):
StatefulSets create one per ordinal from their `volumeClaimTemplates`, pods
name them, the PV controller binds them to PersistentVolumes
(fleet/api/kinds/persistentvolume.py) and writes their status (phase,
capacity, access modes, resize conditions and allocated resources) through
`/status`.

Validation follows kube-apiserver 1.32 (`ValidatePersistentVolumeClaim`,
`...Update` and `...StatusUpdate`): at least one supported access mode,
`ReadWriteOncePod` alone, a positive `resources.requests.storage`, and a spec
that is immutable after creation — because quota and limit ranges were charged
for what the claim asked at creation — except that the binder may fill
`volumeName` once, a claim without `storageClassName` may be given one later
(the retroactive default class), and a *bound* claim may grow
`resources.requests.storage` (volume expansion) but never go down to what was
provisioned (RecoverVolumeExpansionFailure, on in 1.32, allows a retreat above
`status.capacity` only).  Whether a claim may grow at all is the
PersistentVolumeClaimResize admission plugin's call (its class must allow
expansion).
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import col, d, lst, set_default, table
from fleet.api.pvmatch import claim_class, quantity
from fleet.api.quantity import QuantityError, parse_quantity
from fleet.api.quota import canonical, format_of
from fleet.api.registry import KindInfo

Cause = dict[str, str]

ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
# kubectl's short forms, in the order helper.GetAccessModesAsString prints them.
ACCESS_MODE_ABBREV = (("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"),
                      ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP"))
VOLUME_MODES = ("Block", "Filesystem")
PHASES = ("Bound", "Lost", "Pending")
# The pre-storageClassName way of naming a class; still honoured by kubectl's printer.
BETA_STORAGE_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
IMMUTABLE_SPEC = ("spec is immutable after creation except resources.requests and volumeAttributesClassName "
                  "for bound claims")
# status.allocatedResourceStatuses values (resizeStatusSet, sorted).
RESIZE_STATUSES = ("ControllerResizeFailed", "ControllerResizeInProgress", "NodeResizeFailed",
                   "NodeResizeInProgress", "NodeResizePending")


def default_pvc(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        set_default(spec, "volumeMode", "Filesystem")
    # A claim nobody has looked at yet is Pending (SetDefaults_PersistentVolumeClaim);
    # the server drops a client's status on create, so this is what a new claim shows.
    status = obj.get("status")
    if status is None:
        obj["status"] = {"phase": "Pending"}
    elif isinstance(status, dict):
        set_default(status, "phase", "Pending")


def storage_request(spec: Any) -> Any:
    """spec.resources.requests.storage, or None."""
    return d(spec, "resources", "requests").get("storage")


def validate_access_modes(modes: list[Any], path: str, required_detail: str = "") -> list[Cause]:
    """At least one known access mode, and ReadWriteOncePod alone (claims and volumes)."""
    out: list[Cause] = []
    if not modes:
        out.append(v.required(path, required_detail) if required_detail else v.required(path))
    rwop = other = False
    for mode in modes:
        if mode not in ACCESS_MODES:
            out.append(v.not_supported(path, mode, ACCESS_MODES))
        elif mode == "ReadWriteOncePod":
            rwop = True
        else:
            other = True
    if rwop and other:
        out.append(v.forbidden(path, "may not use ReadWriteOncePod with other access modes"))
    return out


def validate_pvc_spec(spec: Any, path: str = "spec") -> list[Cause]:
    """ValidatePersistentVolumeClaimSpec: access modes, storage request, class, volume mode."""
    if not isinstance(spec, dict):
        return [v.required(path) if spec is None else v.type_invalid(path, spec, "object")]
    out: list[Cause] = []
    modes = spec.get("accessModes")
    if modes is not None and not isinstance(modes, list):
        out.append(v.type_invalid(f"{path}.accessModes", modes, "array"))
        modes = []
    out += validate_access_modes(modes or [], f"{path}.accessModes",
                                 "at least 1 access mode is required")
    sel = spec.get("selector")
    if sel is not None:
        out.extend(v.validate_label_selector(sel, f"{path}.selector"))
    res = spec.get("resources")
    if res is not None and not isinstance(res, dict):
        out.append(v.type_invalid(f"{path}.resources", res, "object"))
    else:
        out.extend(v.validate_resources(res, f"{path}.resources"))
    storage = storage_request(spec)
    spath = f"{path}.resources[storage]"
    if storage is None:
        out.append(v.required(spath))
    else:
        q = quantity(storage)
        if q is not None and q <= 0:
            out.append(v.invalid(spath, storage, "must be greater than zero"))
    cls = spec.get("storageClassName")
    if cls:
        if not isinstance(cls, str):
            out.append(v.type_invalid(f"{path}.storageClassName", cls, "string"))
        else:
            for msg in v.is_dns1123_subdomain(cls):
                out.append(v.invalid(f"{path}.storageClassName", cls, msg))
    mode = spec.get("volumeMode")
    if mode is not None and mode not in VOLUME_MODES:
        out.append(v.not_supported(f"{path}.volumeMode", mode, VOLUME_MODES))
    vname = spec.get("volumeName")
    if vname is not None and not isinstance(vname, str):
        out.append(v.type_invalid(f"{path}.volumeName", vname, "string"))
    for key in ("dataSource", "dataSourceRef"):
        src = spec.get(key)
        if src is None:
            continue
        if not isinstance(src, dict):
            out.append(v.type_invalid(f"{path}.{key}", src, "object"))
            continue
        if not src.get("name"):
            out.append(v.required(f"{path}.{key}.name"))
        if not src.get("kind"):
            out.append(v.required(f"{path}.{key}.kind"))
        elif not src.get("apiGroup") and src.get("kind") != "PersistentVolumeClaim":
            out.append(v.invalid(f"{path}.{key}", src.get("kind"), ""))
    return out


def canonical_quantity(raw: Any) -> str:
    """Quantity.String(): `1024Mi` -> `1Gi`; a value that does not parse comes back as it is."""
    try:
        return canonical(parse_quantity(raw), format_of(raw))
    except (QuantityError, TypeError, ValueError):
        return str(raw)


def validate_pvc(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    out += validate_pvc_spec(spec)
    phase = d(obj, "status").get("phase")
    if phase is not None and phase not in PHASES:
        out.append(v.not_supported("status.phase", phase, PHASES))
    if old is not None and isinstance(spec, dict):
        out += _validate_update(obj, old)
    # On create the status was dropped and on a main-resource update it is the stored
    # one, so this judges what a /status write brings (ValidatePersistentVolumeClaimStatusUpdate).
    out += validate_pvc_status(d(obj, "status"))
    return out


def _resource_key_errors(key: str, path: str) -> list[Cause]:
    """validatePersistentVolumeClaimResourceKey: a qualified name; a native one must be `storage`."""
    out = [v.invalid(path, key, msg) for msg in v.is_qualified_name(key)]
    if out:
        return out
    native = "/" not in key or key.startswith("kubernetes.io/")
    if native and key != "storage":
        out.append(v.not_supported(path, key, ("storage",)))
    return out


def validate_pvc_status(status: dict[str, Any]) -> list[Cause]:
    """The status fields the PV controller and the resizers write: capacity and allocated
    resources are quantities, allocatedResourceStatuses one of the resize states."""
    out: list[Cause] = []
    for name, raw in d(status, "capacity").items():
        q = quantity(raw)
        if q is not None and q < 0:
            out.append(v.invalid(f"status.capacity[{name}]", int(q), "must be a valid resource quantity"))
    for key, state in d(status, "allocatedResourceStatuses").items():
        path = "status.allocatedResourceStatus"
        out += _resource_key_errors(key, path)
        if state not in RESIZE_STATUSES:
            # Kubernetes names the key, not the bad value, in this message.
            out.append(v.not_supported(path, key, RESIZE_STATUSES))
    for key, raw in d(status, "allocatedResources").items():
        errs = _resource_key_errors(key, "status.allocatedResources")
        if errs:
            out += errs
            continue
        q = quantity(raw)
        if q is not None and q < 0:
            out.append(v.invalid(f"status.allocatedResources[{key}]", int(q), "must be a valid resource quantity"))
    return out


def _class_upgrades(old: dict[str, Any], new: dict[str, Any]) -> tuple[bool, bool]:
    """(from annotation, from nil): validateStorageClassUpgradeFromAnnotation / ...FromNil.
    A claim whose storageClassName was never set may get one — the value of its beta
    annotation, or any class when it has none (the retroactive default class)."""
    old_ann = d(old, "metadata", "annotations")
    new_ann = d(new, "metadata", "annotations")
    old_name, new_name = d(old, "spec").get("storageClassName"), d(new, "spec").get("storageClassName")
    if old_name is not None or new_name is None:
        return False, False
    if BETA_STORAGE_CLASS_ANNOTATION not in old_ann:
        return False, True
    old_cls = old_ann[BETA_STORAGE_CLASS_ANNOTATION]
    from_ann = new_name == old_cls and new_ann.get(BETA_STORAGE_CLASS_ANNOTATION, old_cls) == old_cls
    return from_ann, new_name == old_cls


def _validate_update(obj: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """ValidatePersistentVolumeClaimUpdate's rules (see the module docstring)."""
    out: list[Cause] = []
    new_spec = copy.deepcopy(d(obj, "spec"))
    old_spec = copy.deepcopy(d(old, "spec"))
    if not old_spec.get("volumeName"):
        # The binder fills volumeName once.
        old_spec["volumeName"] = new_spec.get("volumeName")
        if old_spec["volumeName"] is None:
            old_spec.pop("volumeName")
    from_annotation, from_nil = _class_upgrades(old, obj)
    if from_annotation or from_nil:
        new_spec.pop("storageClassName", None)
    old_size, new_size = storage_request(d(old, "spec")), storage_request(d(obj, "spec"))
    if d(obj, "status").get("phase") == "Bound" and isinstance(new_spec.get("resources"), dict):
        # A bound claim may be resized: compare everything but the storage request.
        requests = new_spec["resources"].get("requests")
        if isinstance(requests, dict):
            if old_size is None:
                requests.pop("storage", None)
            else:
                requests["storage"] = old_size
    # volumeAttributesClassName is compared by its own rule below.
    new_spec.pop("volumeAttributesClassName", None)
    old_spec.pop("volumeAttributesClassName", None)
    if new_spec != old_spec:
        out.append(v.forbidden("spec", IMMUTABLE_SPEC))
    new_q, old_q = quantity(new_size), quantity(old_size)
    if new_q is not None and old_q is not None and new_q < old_q:
        capacity = quantity(d(old, "status", "capacity").get("storage"))
        if new_q <= (capacity if capacity is not None else 0):
            out.append(v.forbidden("spec.resources.requests.storage",
                                   "field can not be less than status.capacity"))
    out += v.immutable(d(obj, "spec").get("volumeMode"), d(old, "spec").get("volumeMode"), "volumeMode")
    old_class = d(old, "metadata", "annotations").get(BETA_STORAGE_CLASS_ANNOTATION)
    new_class = d(obj, "metadata", "annotations").get(BETA_STORAGE_CLASS_ANNOTATION)
    if old_class != new_class and not from_annotation:
        out.append(v.invalid(f"metadata.annotations.{BETA_STORAGE_CLASS_ANNOTATION}", new_class or "",
                             "field is immutable"))
    if d(obj, "spec").get("volumeAttributesClassName") != d(old, "spec").get("volumeAttributesClassName"):
        # The VolumeAttributesClass feature gate is off in Kubernetes 1.32.
        out.append(v.forbidden("spec.volumeAttributesClassName",
                               "update is forbidden when the VolumeAttributesClass feature gate is disabled"))
    return out


def access_modes_string(modes: Any) -> str:
    """helper.GetAccessModesAsString: `RWO,ROX`, always in the same order."""
    have = {m for m in modes if isinstance(m, str)} if isinstance(modes, list) else set()
    return ",".join(abbrev for mode, abbrev in ACCESS_MODE_ABBREV if mode in have)


def _phase(obj: dict[str, Any]) -> str:
    if d(obj, "metadata").get("deletionTimestamp"):
        return "Terminating"
    return str(d(obj, "status").get("phase") or "")


def _bound(obj: dict[str, Any]) -> bool:
    return bool(d(obj, "spec").get("volumeName"))


def _capacity(obj: dict[str, Any]) -> str:
    # kubectl shows the provisioned capacity, and only once the claim is bound.
    return str(d(obj, "status", "capacity").get("storage") or "") if _bound(obj) else ""


PERSISTENT_VOLUME_CLAIM = KindInfo(
    group="", version="v1", kind="PersistentVolumeClaim", plural="persistentvolumeclaims",
    singular="persistentvolumeclaim", short_names=("pvc",), subresources=("status",),
    columns_override=table(
        col("Status", _phase, description="phase represents the current phase of PersistentVolumeClaim."),
        col("Volume", lambda o: str(d(o, "spec").get("volumeName") or ""),
            description="volumeName is the binding reference to the PersistentVolume backing this claim."),
        col("Capacity", _capacity, description="capacity represents the actual resources of the underlying volume."),
        col("Access Modes", lambda o: access_modes_string(lst(o, "status", "accessModes")) if _bound(o) else "",
            description="accessModes contains the actual access modes the volume backing the PVC has."),
        col("StorageClass", claim_class, description="StorageClass of the pvc"),
        col("VolumeAttributesClass", lambda o: str(d(o, "spec").get("volumeAttributesClassName") or "<unset>"),
            description="VolumeAttributesClass of the pvc"),
        wide=(col("VolumeMode", lambda o: str(d(o, "spec").get("volumeMode") or "<unset>"), priority=1,
                  description="volumeMode defines what type of volume is required by the claim."),),
    ),
    default=default_pvc, validate=validate_pvc,
)

KINDS = (PERSISTENT_VOLUME_CLAIM,)

__all__ = ["ACCESS_MODES", "BETA_STORAGE_CLASS_ANNOTATION", "KINDS", "PERSISTENT_VOLUME_CLAIM", "VOLUME_MODES",
           "access_modes_string", "canonical_quantity", "claim_class", "validate_access_modes", "validate_pvc_spec", "validate_pvc_status"]
