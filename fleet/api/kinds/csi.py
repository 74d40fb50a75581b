"""`storage.k8s.io/v1` CSI objects: CSIDriver, CSINode, CSIStorageCapacity, VolumeAttachment.

These are the records Kubernetes' CSI machinery keeps about drivers, and Fleet's
storage drivers (fleet/storage/driver.py) publish the same ones:

* **CSIDriver** (cluster-scoped, named after the driver): what the driver needs
  — an attach step (`attachRequired`), pod information on mount, capacity
  tracking (`storageCapacity`), which lifecycle modes it serves;
* **CSINode** (cluster-scoped, named after its node): the drivers a node's agent
  has registered, with their node IDs and topology keys — the scheduler reads it
  to know where a class's volumes can be provisioned;
* **CSIStorageCapacity** (namespaced, published in `kube-system`): free capacity
  of one class in one topology segment (a node's `kubernetes.io/hostname`);
* **VolumeAttachment** (cluster-scoped): a request to attach a volume to a node,
  done by the external-attacher, which reports through `/status`.

Defaulting, validation and tables follow kube-apiserver 1.32
(`SetDefaults_CSIDriver`, pkg/apis/storage/validation, printers.go) with its
field paths — its quirks too: CSIDriver's `attachRequired` is reported as
`spec.attachedRequired`, and a CSIStorageCapacity table has no AGE column.
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import NONE, col, d, dicts, lst, set_default
from fleet.api.kinds.persistentvolume import validate_csi_driver_name, validate_pv_spec
from fleet.api.kinds.storage import canonical_quantity
from fleet.api.quantity import QuantityError, parse_quantity
from fleet.api.registry import NAME_COLUMN, KindInfo

Cause = dict[str, str]

GROUP = "storage.k8s.io"
FS_GROUP_POLICIES = ("File", "None", "ReadWriteOnceWithFSType")
LIFECYCLE_MODES = ("Persistent", "Ephemeral")
MAX_ATTACHED_METADATA = 256 * 1024
MAX_VOLUME_ERROR_MESSAGE = 1024
MAX_NODE_ID = 256  # CSINodeValidationOptions.AllowLongNodeID, as the 1.32 strategy sets it
MIN_TOKEN_SECONDS = 600


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _bool_cell(value: Any, default: bool) -> bool:
    return value if isinstance(value, bool) else default


# ---------------------------------------------------------------------------
# CSIDriver.
# ---------------------------------------------------------------------------


def default_csi_driver(obj: dict[str, Any]) -> None:
    """SetDefaults_CSIDriver (SELinuxMountReadWriteOncePod is on in 1.32)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    set_default(spec, "attachRequired", True)
    set_default(spec, "podInfoOnMount", False)
    set_default(spec, "storageCapacity", False)
    set_default(spec, "fsGroupPolicy", "ReadWriteOnceWithFSType")
    if not spec.get("volumeLifecycleModes"):
        spec["volumeLifecycleModes"] = ["Persistent"]
    set_default(spec, "requiresRepublish", False)
    set_default(spec, "seLinuxMount", False)


def _csi_driver_spec_errors(spec: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    for key, path in (("attachRequired", "spec.attachedRequired"), ("podInfoOnMount", "spec.podInfoOnMount"),
                      ("storageCapacity", "spec.storageCapacity"), ("seLinuxMount", "spec.seLinuxMount")):
        if spec.get(key) is None:
            out.append(v.required(path))
    policy = spec.get("fsGroupPolicy")
    if policy is not None and policy not in FS_GROUP_POLICIES:
        out.append(v.not_supported("spec.fsGroupPolicy", policy, FS_GROUP_POLICIES))
    audiences: set[str] = set()
    for i, req in enumerate(dicts(lst(spec, "tokenRequests"))):
        path = f"spec.tokenRequests[{i}]"
        audience = _str(req.get("audience"))
        if audience in audiences:
            out.append(v.duplicate(f"{path}.audience", audience))
            continue
        audiences.add(audience)
        seconds = v.as_int(req.get("expirationSeconds"))
        if seconds is None:
            continue
        if seconds < MIN_TOKEN_SECONDS:
            out.append(v.invalid(f"{path}.expirationSeconds", seconds, "may not specify a duration less than 10 minutes"))
        if seconds > 1 << 32:
            out.append(v.invalid(f"{path}.expirationSeconds", seconds,
                                 "may not specify a duration larger than 2^32 seconds"))
    for mode in lst(spec, "volumeLifecycleModes"):
        if mode not in LIFECYCLE_MODES:
            out.append(v.not_supported("spec.volumeLifecycleModes", mode, LIFECYCLE_MODES))
    return out


def validate_csi_driver(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec") if spec is None else v.type_invalid("spec", spec, "object")]
    out += _csi_driver_spec_errors(spec)
    if old is not None:
        old_spec = d(old, "spec")
        out += v.immutable(spec.get("attachRequired"), old_spec.get("attachRequired"), "spec.attachedRequired")
        out += v.immutable(spec.get("volumeLifecycleModes"), old_spec.get("volumeLifecycleModes"),
                           "spec.volumeLifecycleModes")
    return out


def _token_requests_cell(o: dict[str, Any]) -> str:
    reqs = d(o, "spec").get("tokenRequests")
    if reqs is None:
        return "<unset>"
    return ",".join(_str(r.get("audience")) for r in dicts(lst(reqs)))


def _modes_cell(o: dict[str, Any]) -> str:
    return ",".join(str(m) for m in lst(o, "spec", "volumeLifecycleModes")) or NONE


CSI_DRIVER = KindInfo(
    group=GROUP, version="v1", kind="CSIDriver", plural="csidrivers", singular="csidriver", namespaced=False,
    columns=(
        col("AttachRequired", lambda o: _bool_cell(d(o, "spec").get("attachRequired"), True), type="boolean",
            description="attachRequired indicates this CSI volume driver requires an attach operation."),
        col("PodInfoOnMount", lambda o: _bool_cell(d(o, "spec").get("podInfoOnMount"), False), type="boolean",
            description="podInfoOnMount indicates this CSI volume driver requires additional pod information "
            "(like podName, podUID, etc.) during mount operations."),
        col("StorageCapacity", lambda o: _bool_cell(d(o, "spec").get("storageCapacity"), False), type="boolean",
            description="storageCapacity indicates that the CSI volume driver wants pod scheduling to consider "
            "the storage capacity that the driver deployment will report."),
        col("TokenRequests", _token_requests_cell,
            description="tokenRequests indicates the CSI driver needs pods' service account tokens."),
        col("RequiresRepublish", lambda o: _bool_cell(d(o, "spec").get("requiresRepublish"), False),
            type="boolean", description="requiresRepublish indicates the CSI driver wants `NodePublishVolume` "
            "being periodically called to reflect any possible change in the mounted volume."),
        col("Modes", _modes_cell, description="volumeLifecycleModes defines what kind of volumes this CSI volume "
            "driver supports."),
    ),
    default=default_csi_driver, validate=validate_csi_driver,
)


# ---------------------------------------------------------------------------
# CSINode.
# ---------------------------------------------------------------------------


def _csi_node_driver_errors(driver: dict[str, Any], path: str, names: set[str]) -> list[Cause]:
    """validateCSINodeDriver."""
    name = _str(driver.get("name"))
    out = validate_csi_driver_name(name, f"{path}.name")
    node_id = _str(driver.get("nodeID"))
    if not node_id:
        out.append(v.required(f"{path}.nodeID"))
    if len(node_id) > MAX_NODE_ID:
        out.append(v.invalid(f"{path}.nodeID", node_id, f"must be {MAX_NODE_ID} characters or less"))
    count = d(driver, "allocatable").get("count")
    if v.as_int(count) is not None and count < 0:
        out.append(v.invalid(f"{path}.allocatable.count", count, "must be greater than or equal to 0"))
    if name in names:
        out.append(v.duplicate(f"{path}.name", name))
    names.add(name)
    keys: set[str] = set()
    for key in lst(driver, "topologyKeys"):
        key = _str(key)
        if not key:
            out.append(v.required(path))
        if key in keys:
            out.append(v.duplicate(path, key))
        keys.add(key)
        out += [v.invalid(path, key, m) for m in v.is_qualified_name(key)]
    return out


def validate_csi_node(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    names: set[str] = set()
    drivers = dicts(lst(obj, "spec", "drivers"))
    for i, driver in enumerate(drivers):
        out += _csi_node_driver_errors(driver, f"spec.drivers[{i}]", names)
    if old is not None:
        # A registered driver's entry is fixed; drivers come and go as whole entries.
        for old_driver in dicts(lst(old, "spec", "drivers")):
            for driver in drivers:
                if driver.get("name") == old_driver.get("name"):
                    out += v.immutable(driver, old_driver, "spec.drivers")
    return out


CSI_NODE = KindInfo(
    group=GROUP, version="v1", kind="CSINode", plural="csinodes", singular="csinode", namespaced=False,
    columns=(col("Drivers", lambda o: len(lst(o, "spec", "drivers")), type="integer",
                 description="Drivers indicates the number of CSI drivers registered on the node"),),
    validate=validate_csi_node,
)


# ---------------------------------------------------------------------------
# CSIStorageCapacity.
# ---------------------------------------------------------------------------


def validate_csi_storage_capacity(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    topology = obj.get("nodeTopology")
    if topology is not None:
        out += v.validate_label_selector(topology, "nodeTopology")
    cls = _str(obj.get("storageClassName"))
    out += [v.invalid("storageClassName", cls, m) for m in v.is_dns1123_subdomain(cls)]
    raw = obj.get("capacity")
    if raw is not None:
        try:
            if parse_quantity(raw) < 0:
                out.append(v.invalid("capacity", canonical_quantity(raw), "must be greater than or equal to 0"))
        except (QuantityError, TypeError, ValueError):
            pass  # the type check reports it
    if old is not None:
        if topology != old.get("nodeTopology"):
            out.append(v.invalid("nodeTopology", topology, "field is immutable"))
        if obj.get("storageClassName") != old.get("storageClassName"):
            out.append(v.invalid("storageClassName", cls, "field is immutable"))
    return out


CSI_STORAGE_CAPACITY = KindInfo(
    group=GROUP, version="v1", kind="CSIStorageCapacity", plural="csistoragecapacities",
    singular="csistoragecapacity",
    # printers.go gives this table no AGE column.
    columns_override=(
        NAME_COLUMN,
        col("StorageClassName", lambda o: _str(o.get("storageClassName")),
            description="storageClassName represents the name of the StorageClass that the reported capacity "
            "applies to."),
        col("Capacity", lambda o: canonical_quantity(o["capacity"]) if o.get("capacity") is not None
            else "<unset>", description="capacity is the value reported by the CSI driver in its "
            "GetCapacityResponse for a GetCapacityRequest with topology and parameters that match the "
            "previous fields."),
    ),
    validate=validate_csi_storage_capacity,
)


# ---------------------------------------------------------------------------
# VolumeAttachment.
# ---------------------------------------------------------------------------


def _volume_error_errors(err: Any, path: str) -> list[Cause]:
    if not isinstance(err, dict):
        return []
    out: list[Cause] = []
    if len(_str(err.get("message"))) > MAX_VOLUME_ERROR_MESSAGE:
        # Kubernetes names the metadata limit here, not the message one.
        out.append(v.too_long(f"{path}.message", MAX_ATTACHED_METADATA))
    code = v.as_int(err.get("errorCode"))
    if code is not None and code < 0:
        out.append(v.invalid(f"{path}.errorCode", code, "must be between 0 and 2147483647, inclusive"))
    return out


def validate_volume_attachment(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """ValidateVolumeAttachment + ValidateVolumeAttachmentV1 (+ ...Update: the spec is fixed)."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = d(obj, "spec")
    attacher = _str(spec.get("attacher"))
    out += validate_csi_driver_name(attacher, "spec.attacher")
    source = d(spec, "source")
    pv_name, inline = source.get("persistentVolumeName"), source.get("inlineVolumeSpec")
    both = "must specify exactly one of inlineVolumeSpec and persistentVolumeName"
    if pv_name is None and inline is None:
        out.append(v.required("spec.source", both))
    elif pv_name is not None and inline is not None:
        out.append(v.forbidden("spec.source", both))
    elif pv_name is not None:
        if not pv_name:
            out.append(v.required("spec.source.persistentVolumeName", "must specify non empty persistentVolumeName"))
        else:
            out += [v.invalid("spec.source.persistentVolumeName", pv_name, m)
                    for m in v.is_dns1123_subdomain(_str(pv_name))]
    else:
        out += validate_pv_spec(inline, "spec.source.inlineVolumeSpec", inline=True)
    node = _str(spec.get("nodeName"))
    out += [v.invalid("spec.nodeName", node, m) for m in v.is_dns1123_subdomain(node)]
    status = d(obj, "status")
    metadata = d(status, "attachmentMetadata")
    if sum(len(str(k)) + len(_str(val)) for k, val in metadata.items()) > MAX_ATTACHED_METADATA:
        out.append(v.too_long("status.attachmentMetadata", MAX_ATTACHED_METADATA))
    out += _volume_error_errors(status.get("attachError"), "status.attachError")
    out += _volume_error_errors(status.get("detachError"), "status.detachError")
    if old is not None and obj.get("spec") != old.get("spec"):
        out.append(v.invalid("spec", copy.deepcopy(obj.get("spec")), "field is immutable"))
    return out


VOLUME_ATTACHMENT = KindInfo(
    zero_status={"attached": False},
    group=GROUP, version="v1", kind="VolumeAttachment", plural="volumeattachments", singular="volumeattachment",
    namespaced=False, subresources=("status",),
    columns=(
        col("Attacher", lambda o: _str(d(o, "spec").get("attacher")),
            description="attacher indicates the name of the volume driver that MUST handle this request."),
        col("PV", lambda o: _str(d(o, "spec", "source").get("persistentVolumeName")),
            description="persistentVolumeName represents the name of the persistent volume to attach."),
        col("Node", lambda o: _str(d(o, "spec").get("nodeName")),
            description="nodeName represents the node that the volume should be attached to."),
        col("Attached", lambda o: _bool_cell(d(o, "status").get("attached"), False), type="boolean",
            description="attached indicates the volume is successfully attached."),
    ),
    validate=validate_volume_attachment,
)

KINDS = (VOLUME_ATTACHMENT, CSI_DRIVER, CSI_NODE, CSI_STORAGE_CAPACITY)

__all__ = ["CSI_DRIVER", "CSI_NODE", "CSI_STORAGE_CAPACITY", "GROUP", "KINDS", "VOLUME_ATTACHMENT"]
