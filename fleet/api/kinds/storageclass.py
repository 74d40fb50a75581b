"""`storage.k8s.io/v1` StorageClass: how volumes of a class are made.

A class names the `provisioner` (a registered storage driver, see
fleet/storage/registry.py) that creates volumes for claims of that class, the
`parameters` handed to it, the `reclaimPolicy` new volumes get, when binding
happens (`volumeBindingMode`: at once, or once a pod is scheduled —
`WaitForFirstConsumer`), whether claims may grow (`allowVolumeExpansion`) and
where volumes may live (`allowedTopologies`).  The class annotated
`storageclass.kubernetes.io/is-default-class: "true"` is given to new claims
that name none (the DefaultStorageClass admission plugin,
fleet/admission/defaultstorageclass.py).

As kube-apiserver 1.32: `SetDefaults_StorageClass` (reclaim policy `Delete`,
binding mode `Immediate`), `ValidateStorageClass[Update]` of
pkg/apis/storage/validation with its messages — provisioner, parameters,
reclaim policy and binding mode are fixed once the class exists, so volumes
already made stay consistent with their class — and kubectl's
`printStorageClass` (the default class's name gets ` (default)`).
"""

from __future__ import annotations

from typing import Any

from fleet.api import pvmatch
from fleet.api import validation as v
from fleet.api.kinds._common import col, d, dicts, lst, set_default
from fleet.api.registry import AGE_COLUMN, Column, KindInfo

Cause = dict[str, str]

GROUP = "storage.k8s.io"
RECLAIM_POLICIES = ("Delete", "Retain")
BINDING_MODES = (pvmatch.IMMEDIATE, pvmatch.WAIT_FOR_FIRST_CONSUMER)
MAX_PARAMETERS = 512
MAX_PARAMETERS_SIZE = 256 * 1024


def default_storage_class(obj: dict[str, Any]) -> None:
    set_default(obj, "reclaimPolicy", "Delete")
    set_default(obj, "volumeBindingMode", pvmatch.IMMEDIATE)


def _provisioner_errors(provisioner: Any) -> list[Cause]:
    """validateProvisioner: required, and (lower-cased) a qualified name."""
    if not isinstance(provisioner, str) or not provisioner:
        return [v.required("provisioner")]
    lowered = provisioner.lower()
    return [v.invalid("provisioner", lowered, m) for m in v.is_qualified_name(lowered)]


def parameters_errors(params: Any, path: str = "parameters") -> list[Cause]:
    """validateParameters: at most 512 entries of 256 KiB in all, no empty key."""
    if not isinstance(params, dict):
        return []
    if len(params) > MAX_PARAMETERS:
        return [v.too_long(path, MAX_PARAMETERS)]
    out: list[Cause] = []
    size = 0
    for key, value in params.items():
        if not key:
            out.append(v.invalid(path, key, "field can not be empty."))
        size += len(key) + len(value if isinstance(value, str) else "")
    if size > MAX_PARAMETERS_SIZE:
        out.append(v.too_long(path, MAX_PARAMETERS_SIZE))
    return out


def _topology_errors(terms: Any) -> list[Cause]:
    """validateAllowedTopologies / ValidateTopologySelectorTerm."""
    out: list[Cause] = []
    seen: list[dict[str, list[str]]] = []
    for i, term in enumerate(lst(terms)):
        path = f"allowedTopologies[{i}]"
        exprs: dict[str, list[str]] = {}
        for j, req in enumerate(dicts(lst(term, "matchLabelExpressions"))):
            rpath = f"{path}.matchLabelExpressions[{j}]"
            values = [x for x in lst(req, "values") if isinstance(x, str)]
            if not values:
                out.append(v.required(f"{rpath}.values"))
            uniq: list[str] = []
            for k, value in enumerate(values):
                if value in uniq:
                    out.append(v.duplicate(f"{rpath}.values[{k}]", value))
                else:
                    uniq.append(value)
            out += v.validate_label_name(req.get("key"), f"{rpath}.key")
            key = req.get("key") if isinstance(req.get("key"), str) else ""
            if key in exprs:
                out.append(v.duplicate(f"{rpath}.key", key))
            exprs[key] = sorted(uniq)
        if exprs in seen:
            out.append(v.duplicate(f"{path}.matchLabelExpressions", ""))
        seen.append(exprs)
    return out


def validate_storage_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    out += _provisioner_errors(obj.get("provisioner"))
    out += parameters_errors(obj.get("parameters"))
    policy = obj.get("reclaimPolicy")
    if policy and policy not in RECLAIM_POLICIES:
        out.append(v.not_supported("reclaimPolicy", policy, RECLAIM_POLICIES))
    mode = obj.get("volumeBindingMode")
    if mode is None:
        out.append(v.required("volumeBindingMode"))
    elif mode not in BINDING_MODES:
        out.append(v.not_supported("volumeBindingMode", mode, BINDING_MODES))
    out += _topology_errors(obj.get("allowedTopologies"))
    if old is not None:
        # ValidateStorageClassUpdate.  An absent map and an empty one are the same parameters.
        if (obj.get("parameters") or {}) != (old.get("parameters") or {}):
            out.append(v.forbidden("parameters", "updates to parameters are forbidden."))
        if obj.get("provisioner") != old.get("provisioner"):
            out.append(v.forbidden("provisioner", "updates to provisioner are forbidden."))
        if obj.get("reclaimPolicy") != old.get("reclaimPolicy"):
            out.append(v.forbidden("reclaimPolicy", "updates to reclaimPolicy are forbidden."))
        out += v.immutable(obj.get("volumeBindingMode"), old.get("volumeBindingMode"), "volumeBindingMode")
    return out


def _name(obj: dict[str, Any]) -> str:
    name = str(d(obj, "metadata").get("name") or "")
    return name + " (default)" if pvmatch.is_default_class(obj) else name


def _text(obj: dict[str, Any], key: str, default: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) and value else default


STORAGE_CLASS = KindInfo(
    group=GROUP, version="v1", kind="StorageClass", plural="storageclasses", singular="storageclass",
    namespaced=False, short_names=("sc",),
    columns_override=(
        Column("Name", _name, format="name", description="Name must be unique within a namespace."),
        col("Provisioner", lambda o: _text(o, "provisioner", ""),
            description="provisioner indicates the type of the provisioner."),
        col("ReclaimPolicy", lambda o: _text(o, "reclaimPolicy", "Delete"),
            description="reclaimPolicy controls the reclaimPolicy for dynamically provisioned "
            "PersistentVolumes of this storage class. Defaults to Delete."),
        col("VolumeBindingMode", lambda o: _text(o, "volumeBindingMode", pvmatch.IMMEDIATE),
            description="volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and "
            "bound.  When unset, VolumeBindingImmediate is used."),
        col("AllowVolumeExpansion", lambda o: o.get("allowVolumeExpansion") is True,
            description="allowVolumeExpansion shows whether the storage class allow volume expand."),
        AGE_COLUMN,
    ),
    default=default_storage_class, validate=validate_storage_class,
)

KINDS = (STORAGE_CLASS,)

__all__ = ["GROUP", "KINDS", "STORAGE_CLASS", "parameters_errors"]
