"""Claimed volumes on a node: the pure decisions of the agent's CSI volume manager.

`fleet.agent.csivolumes.NodeVolumes` does the I/O (API reads, driver calls, files);
everything it decides is here, as functions of the objects it read, so each rule is
unit tested without a driver or a server:

- which claim a pod volume uses (`claim_name`: `persistentVolumeClaim.claimName`, or
  `<pod>-<volume>` for a generic ephemeral volume, which must be owned by the pod);
- whether the claim and its PersistentVolume may be mounted yet (`check_claim`,
  `check_volume`), with the kubelet's words for why not;
- the CSI facts of a volume (`volume_facts`): driver, handle, mode, read-only;
- where it goes (`staging_path`: `<data_dir>/plugins/kubernetes.io/csi/<driver>/
  <sha256(volumeHandle)>/globalmount`, as the kubelet's CSI plugin lays it out);
- what a pod has published (`PodRecord`, the small JSON under the pod dir that a
  restarted agent reads back) and which staged volumes nobody uses (`unused_stagings`);
- node-side expansion (`expansion_step`), the CSINode object (`csinode_drivers`), the
  VolumeAttachment name (`attachment_name`), and the stats the agent serves
  (`summary_entry`, `metric_samples`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet.api.pvmatch import quantity
from fleet.storage.driver import VolumeStats

# The kubelet's CSI plugin directory, below the agent's data dir.
CSI_PLUGIN_DIR = Path("plugins") / "kubernetes.io" / "csi"
RECORD_NAME = "csi-volumes.json"
VOL_DATA_NAME = "vol_data.json"
# The Node annotation the kubelet's CSI plugin manager writes: driver → node id.
NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid"
# PVC condition types (core/v1).
FS_RESIZE_PENDING = "FileSystemResizePending"
RESIZING = "Resizing"


class MountProblem(Exception):
    """The volume cannot be mounted yet; `message` is the kubelet's reason."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DriverFailure(Exception):
    """A driver call of set-up failed; `message` is the kubelet's FailedMount text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def driver_failure(operation: str, pv: str, code: str, message: str) -> DriverFailure:
    """The kubelet's words for a failed CSI call: `MountVolume.MountDevice failed for
    volume "pv" : rpc error: code = Internal desc = ...` (MountDevice = node_stage,
    SetUp = node_publish)."""
    return DriverFailure(f'MountVolume.{operation} failed for volume "{pv}" : '
                         f"rpc error: code = {code} desc = {message}")


def _d(obj: Any, *path: str) -> dict[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, dict) else {}


# ---------------------------------------------------------------------------------------
# Which claim, and may it be used


def is_claim_volume(vol: Mapping[str, Any]) -> bool:
    return "persistentVolumeClaim" in vol or "ephemeral" in vol


def claim_name(pod: Mapping[str, Any], vol: Mapping[str, Any]) -> str:
    """The claim behind a pod volume: its claimName, or `<pod>-<volume>` (ephemeral)."""
    if "ephemeral" in vol:
        return f"{_d(pod, 'metadata').get('name', '')}-{vol.get('name', '')}"
    return str(_d(vol, "persistentVolumeClaim").get("claimName") or "")


def check_claim(pod: Mapping[str, Any], vol: Mapping[str, Any],
                claim: Mapping[str, Any] | None, error: str = "") -> str:
    """The bound claim's volume name; MountProblem with the kubelet's message if the
    claim cannot be used (missing, being deleted, not bound, an ephemeral claim some
    other pod owns).  `error` is the API error when the read failed."""
    ns = _d(pod, "metadata").get("namespace") or "default"
    name = claim_name(pod, vol)
    prefix = f"error processing PVC {ns}/{name}: "
    if claim is None:
        raise MountProblem(prefix + f"failed to fetch PVC from API server: {error or 'not found'}")
    if _d(claim, "metadata").get("deletionTimestamp"):
        raise MountProblem(prefix + "PVC is being deleted")
    if _d(claim, "status").get("phase") != "Bound":
        raise MountProblem(prefix + "PVC is not bound")
    pv_name = str(_d(claim, "spec").get("volumeName") or "")
    if not pv_name:
        raise MountProblem(prefix + "PVC has empty pvc.Spec.VolumeName")
    if "ephemeral" in vol:
        uid = _d(pod, "metadata").get("uid")
        owners = _d(claim, "metadata").get("ownerReferences") or []
        if not any(isinstance(o, dict) and o.get("uid") == uid and o.get("controller")
                   for o in owners):
            raise MountProblem(f"PVC {ns}/{name} was not created for pod "
                               f"{ns}/{_d(pod, 'metadata').get('name', '')} (pod is not owner)")
    return pv_name


def check_volume(pod: Mapping[str, Any], vol: Mapping[str, Any], claim: Mapping[str, Any],
                 pv: Mapping[str, Any] | None, error: str = "") -> None:
    """MountProblem unless `pv` exists and is bound to `claim` (the kubelet's getPVSpec)."""
    ns = _d(pod, "metadata").get("namespace") or "default"
    prefix = f"error processing PVC {ns}/{claim_name(pod, vol)}: "
    name = str(_d(claim, "spec").get("volumeName") or "")
    if pv is None:
        raise MountProblem(prefix + f"failed to fetch PV {name} from API server: "
                           f"{error or 'not found'}")
    ref = _d(pv, "spec", "claimRef")
    if not ref:
        raise MountProblem(prefix + f"found PV object {name} but it has a nil pv.Spec.ClaimRef "
                           "indicating it is not yet bound to the claim")
    want = _d(claim, "metadata").get("uid") or ""
    if ref.get("uid") != want:
        raise MountProblem(prefix + f"found PV object {name} but its pv.Spec.ClaimRef.UID "
                           f"{ref.get('uid') or ''} does not point to claim.UID {want}")


def failed_mount_message(volume: str, detail: str) -> str:
    """The kubelet's FailedMount event when a pod's volumes are not all mounted."""
    return (f"Unable to attach or mount volumes: unmounted volumes=[{volume}], "
            f"unattached volumes=[], failed to process volumes=[{volume}]: {detail}")


# ---------------------------------------------------------------------------------------
# The volume's CSI facts


@dataclass(frozen=True)
class VolumeFacts:
    driver: str
    handle: str
    pv: str
    mode: str                 # Filesystem | Block
    read_only: bool           # published read-only
    fs_type: str
    attributes: dict[str, str]


def volume_facts(vol: Mapping[str, Any], pv: Mapping[str, Any]) -> VolumeFacts:
    """What the node calls need; MountProblem for a PV that is not a CSI volume."""
    spec = _d(pv, "spec")
    csi = _d(spec, "csi")
    name = str(_d(pv, "metadata").get("name") or "")
    if not csi.get("driver") or not csi.get("volumeHandle"):
        kinds = sorted(k for k in spec if k not in (
            "accessModes", "capacity", "claimRef", "persistentVolumeReclaimPolicy",
            "storageClassName", "volumeMode", "nodeAffinity", "mountOptions"))
        raise MountProblem(f"PersistentVolume {name}: only CSI volumes (spec.csi) can be "
                           f"mounted on this node, not {kinds or 'none'}")
    read_only = (bool(_d(vol, "persistentVolumeClaim").get("readOnly"))
                 or bool(csi.get("readOnly"))
                 or list(spec.get("accessModes") or []) == ["ReadOnlyMany"])
    return VolumeFacts(driver=str(csi["driver"]), handle=str(csi["volumeHandle"]), pv=name,
                       mode=str(spec.get("volumeMode") or "Filesystem"), read_only=read_only,
                       fs_type=str(csi.get("fsType") or ""),
                       attributes={str(k): str(v) for k, v in
                                   (csi.get("volumeAttributes") or {}).items()})


def staging_path(data_dir: Path, driver: str, handle: str) -> Path:
    """`<data_dir>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`."""
    digest = hashlib.sha256(handle.encode()).hexdigest()
    return Path(data_dir) / CSI_PLUGIN_DIR / driver / digest / "globalmount"


# ---------------------------------------------------------------------------------------
# What a pod has published (persisted under the pod dir)


@dataclass
class Published:
    volume: str               # the pod's volume name
    driver: str
    handle: str
    pv: str
    claim: str
    namespace: str
    mode: str
    read_only: bool
    target: str               # publish target (a directory, or a file for Block)
    staging: str
    done: bool = False        # node_publish returned

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.handle)


@dataclass
class PodRecord:
    uid: str
    volumes: dict[str, Published] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"uid": self.uid,
                           "volumes": [asdict(p) for p in self.volumes.values()]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> PodRecord:
        doc = json.loads(text)
        vols = {}
        for v in doc.get("volumes") or []:
            p = Published(**{k: v[k] for k in Published.__dataclass_fields__ if k in v})
            vols[p.volume] = p
        return cls(uid=str(doc.get("uid") or ""), volumes=vols)


def load_record(pod_dir: Path) -> PodRecord | None:
    """The pod's record, None when it has none (blocking)."""
    try:
        return PodRecord.from_json((Path(pod_dir) / RECORD_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save_record(pod_dir: Path, record: PodRecord) -> None:
    """Write the record atomically (blocking)."""
    pod_dir = Path(pod_dir)
    pod_dir.mkdir(parents=True, exist_ok=True)
    tmp = pod_dir / (RECORD_NAME + ".tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, pod_dir / RECORD_NAME)


def users(records: Iterable[PodRecord]) -> dict[tuple[str, str], set[str]]:
    """(driver, handle) → the pod uids that have it published (or being published)."""
    out: dict[tuple[str, str], set[str]] = {}
    for r in records:
        for p in r.volumes.values():
            out.setdefault(p.key, set()).add(r.uid)
    return out


@dataclass(frozen=True)
class Staged:
    driver: str
    handle: str
    path: Path               # the globalmount dir


def unused_stagings(staged: Iterable[Staged],
                    in_use: Mapping[tuple[str, str], set[str]]) -> list[Staged]:
    """Staged volumes no pod on the node uses: to be unstaged."""
    return [s for s in staged if not in_use.get((s.driver, s.handle))]


# ---------------------------------------------------------------------------------------
# Node-side expansion


@dataclass(frozen=True)
class ExpandStep:
    capacity_bytes: int       # what to grow to (the PV's capacity)
    capacity: str             # the same, as the PV writes it


def has_condition(claim: Mapping[str, Any], ctype: str) -> bool:
    return any(isinstance(c, dict) and c.get("type") == ctype and c.get("status") == "True"
               for c in _d(claim, "status").get("conditions") or [])


def expansion_step(claim: Mapping[str, Any], pv: Mapping[str, Any]) -> ExpandStep | None:
    """Grow the filesystem now?  When the resizer left FileSystemResizePending on the
    claim (the controller side is done), to the PV's capacity."""
    if not has_condition(claim, FS_RESIZE_PENDING):
        return None
    cap = _d(pv, "spec", "capacity").get("storage")
    size = quantity(cap)
    if size is None:
        return None
    return ExpandStep(capacity_bytes=int(size), capacity=str(cap))


def expanded_claim_status(claim: Mapping[str, Any], capacity: str) -> dict[str, Any]:
    """The claim status after a successful node expansion, as the kubelet writes it:
    status.capacity = the PV's, the FileSystemResizePending condition gone, and
    allocatedResourceStatuses' storage entry cleared."""
    status = dict(_d(claim, "status"))
    status["capacity"] = {**_d(claim, "status", "capacity"), "storage": capacity}
    status["conditions"] = [c for c in status.get("conditions") or []
                            if not (isinstance(c, dict) and c.get("type") in
                                    (FS_RESIZE_PENDING, RESIZING))]
    alloc = dict(_d(claim, "status", "allocatedResourceStatuses"))
    alloc.pop("storage", None)
    if "allocatedResourceStatuses" in status:
        status["allocatedResourceStatuses"] = alloc or None
    return status


# ---------------------------------------------------------------------------------------
# CSINode


def csinode_drivers(drivers: Mapping[str, Any], node_name: str,
                    allocatable: Mapping[str, int | None] | None = None) -> list[dict[str, Any]]:
    """CSINode.spec.drivers for the registered drivers (name → instance), by name."""
    out = []
    for name in sorted(drivers):
        caps = getattr(drivers[name], "capabilities", None)
        entry: dict[str, Any] = {"name": name, "nodeID": node_name,
                                 "topologyKeys": list(getattr(caps, "topology_keys", ()) or ())}
        count = (allocatable or {}).get(name)
        if count is not None:
            entry["allocatable"] = {"count": int(count)}
        out.append(entry)
    return out


def node_id_annotation(drivers: Iterable[str], node_name: str,
                       current: str | None = None) -> str:
    """The Node's csi.volume.kubernetes.io/nodeid value: a JSON map driver → node id,
    keeping entries of drivers registered by someone else."""
    try:
        have = json.loads(current) if current else {}
    except ValueError:
        have = {}
    if not isinstance(have, dict):
        have = {}
    have.update({d: node_name for d in drivers})
    return json.dumps(dict(sorted(have.items())), separators=(",", ":"))


# ---------------------------------------------------------------------------------------
# Stats


def summary_entry(volume: str, stats: VolumeStats, claim: str | None,
                  namespace: str, time: str) -> dict[str, Any]:
    """One `pods[].volume[]` entry of the kubelet's /stats/summary."""
    entry: dict[str, Any] = {"time": time, "availableBytes": stats.available_bytes,
                             "capacityBytes": stats.capacity_bytes,
                             "usedBytes": stats.used_bytes, "name": volume}
    for key, value in (("inodesFree", stats.inodes_free), ("inodes", stats.inodes),
                       ("inodesUsed", stats.inodes_used)):
        if value is not None:
            entry[key] = value
    if claim:
        entry["pvcRef"] = {"name": claim, "namespace": namespace}
    if stats.abnormal or stats.message:
        entry["volumeHealthStats"] = {"abnormal": stats.abnormal}
    return entry


METRICS = (
    ("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", "capacity_bytes"),
    ("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume",
     "available_bytes"),
    ("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", "used_bytes"),
    ("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", "inodes"),
    ("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", "inodes_free"),
    ("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", "inodes_used"),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metric_samples(stats: Iterable[tuple[str, str, VolumeStats]]) -> str:
    """kubelet_volume_stats_* in Prometheus text format, one sample per claim
    ((namespace, claim, stats) triples; a claim used by two pods counts once)."""
    seen: dict[tuple[str, str], VolumeStats] = {}
    for ns, claim, st in stats:
        seen.setdefault((ns, claim), st)
    lines: list[str] = []
    for metric, help_, attr in METRICS:
        lines.append(f"# HELP {metric} [ALPHA] {help_}")
        lines.append(f"# TYPE {metric} gauge")
        for (ns, claim), st in sorted(seen.items()):
            value = getattr(st, attr)
            if value is None:
                continue
            lines.append(f'{metric}{{namespace="{_label(ns)}",persistentvolumeclaim='
                         f'"{_label(claim)}"}} {float(value)}')
    return "\n".join(lines) + "\n"


__all__ = [
    "CSI_PLUGIN_DIR", "DriverFailure", "FS_RESIZE_PENDING", "METRICS", "NODE_ID_ANNOTATION", "RECORD_NAME",
    "VOL_DATA_NAME", "ExpandStep", "MountProblem", "PodRecord", "Published", "Staged",
    "VolumeFacts", "check_claim", "check_volume", "claim_name",
    "csinode_drivers", "driver_failure", "expanded_claim_status", "expansion_step", "failed_mount_message",
    "has_condition", "is_claim_volume", "load_record", "metric_samples", "node_id_annotation",
    "save_record", "staging_path", "summary_entry", "unused_stagings", "users", "volume_facts",
]
