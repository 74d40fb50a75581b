"""Claims and volumes: the names and the pure matching rules binder and scheduler share.

The PersistentVolume controller (binding claims to volumes), the scheduler's
VolumeBinding plugin (which volumes a pod could use on a node) and the agent all
need the same answers — is this claim bound, which class does it ask for, which
available volume fits it best, may this volume be used from that node — so they
live here once, with Kubernetes' annotation names.

`find_matching_volume` is kube-controller-manager's `FindMatchingVolume`: a volume
pre-bound to the claim wins; otherwise the smallest Available volume of the
claim's class whose capacity, access modes, volume mode, label selector and (when a
node is given) node affinity fit.  With `delay_binding` and no node (a
WaitForFirstConsumer claim seen by the PV controller) only pre-bound volumes
match: the scheduler binds the rest once it knows the node.

The scheduler's provisioning checks live here too (kube-scheduler's
checkVolumeProvisions / hasEnoughCapacity): a class's `allowedTopologies`
(`topology_allows`), a driver's CSIStorageCapacity objects (`has_enough_capacity`:
capacity, or the more precise maximumVolumeSize, reachable from the node by
nodeTopology), whether a node's CSINode lists the driver (`csinode_has_driver`), and
the volume side of a binding (`bind_volume_to_claim`, GetBindVolumeToClaim).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from fleet.api.nodeaffinity import compile_term, term_matches
from fleet.api.quantity import QuantityError, parse_quantity
from fleet.api.selectors import selector_dict_matches

# Claim and volume annotations (k8s.io/component-helpers/storage/volume, pv_controller.go).
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
BETA_DEFAULT_CLASS = "storageclass.beta.kubernetes.io/is-default-class"
# Finalizers (StorageObjectInUseProtection).
PVC_PROTECTION = "kubernetes.io/pvc-protection"
PV_PROTECTION = "kubernetes.io/pv-protection"
# Binding modes.
IMMEDIATE = "Immediate"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
# A class whose volumes are made by hand: nothing to provision (volume.NotSupportedProvisioner).
NO_PROVISIONER = "kubernetes.io/no-provisioner"


def _d(obj: Any, *path: str) -> dict[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, dict) else {}


def quantity(value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except (QuantityError, TypeError, ValueError):
        return None


def claim_class(claim: Mapping[str, Any]) -> str:
    """GetPersistentVolumeClaimClass: the beta annotation wins over storageClassName."""
    ann = _d(claim, "metadata", "annotations").get(BETA_STORAGE_CLASS)
    if ann is not None:
        return str(ann)
    return str(_d(claim, "spec").get("storageClassName") or "")


def volume_class(pv: Mapping[str, Any]) -> str:
    """GetPersistentVolumeClass."""
    ann = _d(pv, "metadata", "annotations").get(BETA_STORAGE_CLASS)
    if ann is not None:
        return str(ann)
    return str(_d(pv, "spec").get("storageClassName") or "")


def claim_request(claim: Mapping[str, Any]) -> Decimal | None:
    return quantity(_d(claim, "spec", "resources", "requests").get("storage"))


def volume_capacity(pv: Mapping[str, Any]) -> Decimal | None:
    return quantity(_d(pv, "spec", "capacity").get("storage"))


def is_claim_bound(claim: Mapping[str, Any]) -> bool:
    """A claim counts as bound when it names its volume and is Bound or bind-completed."""
    if not _d(claim, "spec").get("volumeName"):
        return False
    return (_d(claim, "status").get("phase") == "Bound"
            or BIND_COMPLETED in _d(claim, "metadata", "annotations"))


def is_default_class(sc: Mapping[str, Any]) -> bool:
    """storageutil.IsDefaultAnnotation: either annotation is exactly "true"."""
    ann = _d(sc, "metadata", "annotations")
    return ann.get(DEFAULT_CLASS) == "true" or ann.get(BETA_DEFAULT_CLASS) == "true"


def default_class(classes: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The default StorageClass; with several, the newest, ties to the smaller name
    (storageutil.GetDefaultClass, Kubernetes ≥1.26)."""
    defaults = sorted((sc for sc in classes if is_default_class(sc)),
                      key=lambda sc: str(_d(sc, "metadata").get("name") or ""))
    if not defaults:
        return None
    # max() keeps the first of equals: the smallest name among the newest.
    return max(defaults, key=lambda sc: str(_d(sc, "metadata").get("creationTimestamp") or ""))


def delays_binding(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> bool:
    """The claim's class binds WaitForFirstConsumer (an unknown or empty class binds at once)."""
    name = claim_class(claim)
    sc = classes.get(name) if name else None
    return sc is not None and sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER


def access_modes_contain(have: Iterable[str], want: Iterable[str]) -> bool:
    """Every requested mode is offered; modes match literally, as CheckAccessModes does."""
    offered = set(have)
    return all(m in offered for m in want)


def is_volume_bound_to_claim(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    ref = _d(pv, "spec", "claimRef")
    if not ref:
        return False
    md = _d(claim, "metadata")
    if ref.get("name") != md.get("name") or ref.get("namespace") != md.get("namespace"):
        return False
    return not ref.get("uid") or ref.get("uid") == md.get("uid")


def volume_node_affinity_matches(pv: Mapping[str, Any], node_labels: Mapping[str, str],
                                 node_name: str = "") -> bool:
    """CheckNodeAffinity: the volume's spec.nodeAffinity.required admits the node (no
    affinity admits every node; a required selector with no usable term admits none)."""
    required = _d(pv, "spec", "nodeAffinity", "required")
    if not required:
        return True
    terms = [compile_term(t) for t in required.get("nodeSelectorTerms") or []]
    return any(t is not None and term_matches(t, node_labels, node_name) for t in terms)


def volume_node_name(pv: Mapping[str, Any]) -> str | None:
    """The node a volume is pinned to by a single kubernetes.io/hostname `In` value, if so."""
    terms = _d(pv, "spec", "nodeAffinity", "required").get("nodeSelectorTerms") or []
    if len(terms) != 1 or not isinstance(terms[0], dict):
        return None
    for expr in terms[0].get("matchExpressions") or []:
        if (isinstance(expr, dict) and expr.get("key") == "kubernetes.io/hostname"
                and expr.get("operator") == "In" and len(expr.get("values") or []) == 1):
            return str(expr["values"][0])
    return None


def volume_fits_claim(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Mode, class, access modes, selector and size fit — everything but phase, claimRef
    and node (`find_matching_volume` checks those)."""
    spec, cspec = _d(pv, "spec"), _d(claim, "spec")
    if (spec.get("volumeMode") or "Filesystem") != (cspec.get("volumeMode") or "Filesystem"):
        return False
    if volume_class(pv) != claim_class(claim):
        return False
    if not access_modes_contain(spec.get("accessModes") or [], cspec.get("accessModes") or []):
        return False
    want, have = claim_request(claim), volume_capacity(pv)
    if want is None or have is None or have < want:
        return False
    selector = cspec.get("selector")
    return not selector or selector_dict_matches(selector, _d(pv, "metadata", "labels"))


def find_matching_volume(claim: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]], *,
                         node_labels: Mapping[str, str] | None = None, node_name: str = "",
                         exclude: frozenset[str] | set[str] = frozenset(),
                         delay_binding: bool = False) -> Mapping[str, Any] | None:
    """The volume `claim` should bind to, or None (see the module docstring).

    `node_labels` are the labels of the node the claim's pod goes to (scheduler): a
    volume pre-bound to the claim that the node cannot use means no match at all;
    `exclude` names volumes already promised in this cycle."""
    wanted_name = _d(claim, "spec").get("volumeName")
    best: Mapping[str, Any] | None = None
    best_size: Decimal | None = None
    for pv in volumes:
        name = str(_d(pv, "metadata").get("name") or "")
        if name in exclude or _d(pv, "metadata").get("deletionTimestamp"):
            continue
        if wanted_name and name != wanted_name:
            continue
        fits = volume_fits_claim(pv, claim)
        if is_volume_bound_to_claim(pv, claim):
            if node_labels is not None and not volume_node_affinity_matches(pv, node_labels, node_name):
                return None  # pre-bound to a volume this node cannot use: no match here
            if fits or wanted_name:
                return pv
            continue
        if not fits:
            continue
        if node_labels is None and delay_binding:
            continue
        if _d(pv, "status").get("phase") not in (None, "Available"):
            continue
        if _d(pv, "spec").get("claimRef"):
            continue
        if node_labels is not None and not volume_node_affinity_matches(pv, node_labels, node_name):
            continue
        size = volume_capacity(pv)
        if best is None or (size is not None and best_size is not None and size < best_size):
            best, best_size = pv, size
    return best


def bind_volume_to_claim(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """GetBindVolumeToClaim: a copy of `pv` whose spec.claimRef names `claim` (uid and
    resourceVersion included), and whether anything changed.  A volume not yet bound to
    the claim also gets `pv.kubernetes.io/bound-by-controller: "yes"` (the binding was
    made by a controller or the scheduler, not pre-bound by the user)."""
    new = copy.deepcopy(dict(pv))
    spec = new["spec"] = new.get("spec") if isinstance(new.get("spec"), dict) else {}
    md = _d(claim, "metadata")
    ref = spec.get("claimRef") if isinstance(spec.get("claimRef"), dict) else None
    already = is_volume_bound_to_claim(pv, claim)
    dirty = False
    if ref is None or ref.get("uid") != md.get("uid") or ref.get("name") != md.get("name") \
            or ref.get("namespace") != md.get("namespace"):
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                            "namespace": md.get("namespace"), "name": md.get("name"),
                            "uid": md.get("uid"), "resourceVersion": md.get("resourceVersion")}
        dirty = True
    if not already:
        meta = new.get("metadata") if isinstance(new.get("metadata"), dict) else {}
        new["metadata"] = meta
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        if BOUND_BY_CONTROLLER not in annotations:
            meta["annotations"] = {**annotations, BOUND_BY_CONTROLLER: "yes"}
            dirty = True
    return new, dirty


def topology_allows(allowed_topologies: Any, node_labels: Mapping[str, str]) -> bool:
    """MatchTopologySelectorTerms: a class's `allowedTopologies` admit the node (no terms
    admit every node; a term admits it when every expression's key has one of its values)."""
    if not allowed_topologies:
        return True
    for term in allowed_topologies:
        exprs = term.get("matchLabelExpressions") if isinstance(term, Mapping) else None
        if not exprs:
            continue
        if all(isinstance(e, Mapping) and e.get("key") in node_labels
               and node_labels[e["key"]] in (e.get("values") or []) for e in exprs):
            return True
    return False


def capacity_limit(capacity: Mapping[str, Any]) -> Decimal | None:
    """The biggest volume a CSIStorageCapacity allows: maximumVolumeSize when set (more
    precise), else capacity."""
    limit = capacity.get("maximumVolumeSize")
    if limit is None:
        limit = capacity.get("capacity")
    return quantity(limit) if limit is not None else None


def capacity_admits_node(capacity: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
    """nodeHasAccess: the capacity's nodeTopology selects the node (none: nobody)."""
    topology = capacity.get("nodeTopology")
    return topology is not None and selector_dict_matches(topology, node_labels)


def has_enough_capacity(claim: Mapping[str, Any], class_name: str, driver: Mapping[str, Any] | None,
                        capacities: Iterable[Mapping[str, Any]],
                        node_labels: Mapping[str, str]) -> bool:
    """hasEnoughCapacity: a new volume for `claim` fits what the class's provisioner
    publishes for the node.  Only drivers whose CSIDriver says `storageCapacity: true` are
    checked (no request, no CSIDriver object, or no opt-in: it fits); then some
    CSIStorageCapacity of the class reachable from the node must allow the request."""
    want = claim_request(claim)
    if want is None or driver is None or _d(driver, "spec").get("storageCapacity") is not True:
        return True
    for cap in capacities:
        if cap.get("storageClassName") != class_name:
            continue
        limit = capacity_limit(cap)
        if limit is not None and limit >= want and capacity_admits_node(cap, node_labels):
            return True
    return False


def csinode_has_driver(csinode: Mapping[str, Any] | None, driver: str) -> bool:
    """The node's CSINode lists `driver` (its node plugin registered there)."""
    for d in _d(csinode, "spec").get("drivers") or []:
        if isinstance(d, Mapping) and d.get("name") == driver:
            return True
    return False


def attachment_name(volume_handle: str, driver: str, node: str) -> str:
    """A VolumeAttachment's name: csi-<sha256(volumeHandle + driver + node)> in hex, as
    Kubernetes' CSI attacher (`getAttachmentName(volName, csiDriverName, nodeName)`)
    names it — the attach/detach controller creates it, the agent waits for it."""
    return "csi-" + hashlib.sha256(f"{volume_handle}{driver}{node}".encode()).hexdigest()


def unique_volume_name(driver: str, volume_handle: str) -> str:
    """The kubelet's name for a CSI volume (node.status.volumesInUse / volumesAttached)."""
    return f"kubernetes.io/csi/{driver}^{volume_handle}"


def ephemeral_claim_name(pod_name: str, volume_name: str) -> str:
    """ephemeral.VolumeClaimName: a generic ephemeral volume's claim is `<pod>-<volume>`."""
    return f"{pod_name}-{volume_name}"


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The claims (in the pod's namespace) the pod's volumes use: each
    `persistentVolumeClaim.claimName`, and `<pod>-<volume>` for each `ephemeral` volume."""
    pod_name = str(_d(pod, "metadata").get("name") or "")
    out: list[str] = []
    for vol in _d(pod, "spec").get("volumes") or []:
        if not isinstance(vol, Mapping):
            continue
        pvc = vol.get("persistentVolumeClaim")
        if isinstance(pvc, Mapping) and pvc.get("claimName"):
            out.append(str(pvc["claimName"]))
        elif isinstance(vol.get("ephemeral"), Mapping) and vol.get("name"):
            out.append(ephemeral_claim_name(pod_name, str(vol["name"])))
    return out


def pod_is_terminated(pod: Mapping[str, Any]) -> bool:
    """The pod's containers are done for good: Succeeded or Failed, or — podIsShutDown —
    deleted with a zero grace period (the kubelet finished it, or it was force-deleted)."""
    if _d(pod, "status").get("phase") in ("Succeeded", "Failed"):
        return True
    md = _d(pod, "metadata")
    return bool(md.get("deletionTimestamp")) and md.get("deletionGracePeriodSeconds") == 0


__all__ = [
    "BETA_DEFAULT_CLASS", "BETA_STORAGE_CLASS", "BETA_STORAGE_PROVISIONER", "BIND_COMPLETED",
    "BOUND_BY_CONTROLLER", "DEFAULT_CLASS", "IMMEDIATE", "NO_PROVISIONER", "PROVISIONED_BY",
    "PVC_PROTECTION", "PV_PROTECTION", "SELECTED_NODE", "STORAGE_PROVISIONER",
    "WAIT_FOR_FIRST_CONSUMER", "access_modes_contain", "attachment_name", "bind_volume_to_claim",
    "capacity_admits_node", "capacity_limit", "claim_class", "claim_request", "csinode_has_driver",
    "default_class", "delays_binding", "ephemeral_claim_name", "find_matching_volume",
    "has_enough_capacity", "is_claim_bound", "is_default_class", "is_volume_bound_to_claim",
    "pod_claim_names", "pod_is_terminated", "quantity", "topology_allows", "unique_volume_name",
    "volume_capacity", "volume_class", "volume_fits_claim", "volume_node_affinity_matches",
    "volume_node_name",
]
