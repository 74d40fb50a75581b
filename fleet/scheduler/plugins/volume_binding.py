"""VolumeBinding: pods go where their PersistentVolumeClaims can be (or are) served.

kube-scheduler's volumebinding plugin, with its wording, in four points:

pre_filter — what claims alone decide, the same for every node, all
unresolvable (evicting pods does not create claims):
- a claim that does not exist: `persistentvolumeclaim "x" not found`
  (a generic ephemeral volume's claim, named `<pod>-<volume>`, gets
  "waiting for ephemeral volume controller to create the persistentvolumeclaim \"x\"",
  and one not owned by the pod "PVC ns/x was not created for pod ns/p (pod is not owner)");
- a claim being deleted, or Lost: refused;
- an unbound claim whose class binds immediately (or no class, or one named
  but unknown), and a WaitForFirstConsumer claim already naming its volume but
  not yet bound: "pod has unbound immediate PersistentVolumeClaims" — the PV
  controller binds it, and the pod is retried once the claim changes.
A claim counts as bound when it names its volume and is Bound or
bind-completed (`fleet.api.pvmatch.is_claim_bound`).  The rest are split into
bound claims and unbound WaitForFirstConsumer ("delayed") claims.

filter — `find_pod_volumes` (FindPodVolumes), per node:
- a bound claim's PersistentVolume must admit the node by its node affinity, else
  "node(s) had volume node affinity conflict"; a volume that does not exist gives
  "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
- a delayed claim already given a node (`volume.kubernetes.io/selected-node`,
  or assumed by a pod being bound) fits that node only;
- otherwise a static volume must match on this node (`pvmatch.find_matching_volume`
  with the node's labels; smallest claims first; a volume chosen for one claim, or
  promised to another pod's claim, is not offered again), or the claim must be
  provisionable here: a class provisioner other than kubernetes.io/no-provisioner,
  the class's allowedTopologies admitting the node, the node's CSINode listing the
  driver (when the provisioner is a known CSIDriver: its node plugin must run there
  to mount the volume — Fleet's addition, upstream leaves that to the provisioner),
  else "node(s) didn't find available persistent volumes to bind"; and when the
  CSIDriver tracks capacity, a CSIStorageCapacity of the class reachable from the
  node allowing the request, else "node(s) did not have enough free storage".
The node's answer (static bindings, claims to provision) is kept in the cycle state.

reserve / unreserve — the chosen node's volumes are promised in the snapshot
(kube-scheduler's assume cache) so the next cycles do not offer them to another
pod while this one binds; unreserve takes the promise back.

pre_bind — before the Binding is posted: each chosen static volume gets
`spec.claimRef` (with the claim's uid) and `pv.kubernetes.io/bound-by-controller`
(a PUT carrying the resourceVersion seen when deciding: a volume that changed
meanwhile is a conflict, never taken from someone else), each claim to provision
gets `volume.kubernetes.io/selected-node: <node>`; then it waits (bounded by
`BindHandle.timeout`, looking every `poll_interval`) until the informers show
every such claim bound.  A claim whose selected-node disappears (the provisioner
gave up: RESOURCE_EXHAUSTED), a volume whose claimRef was reset, or the timeout
fail the binding with upstream's words ("binding volumes: provisioning failed
for PVC ...", "binding volumes: timed out waiting for the condition") and the
pod is retried.

Until the snapshot has listed claims (`Snapshot.pvcs_synced`) a missing claim
proves nothing, and until it has listed PersistentVolumes (`pvs_synced`: a
server without the kind never does) only the pre-filter checks run.  Pods
without claims skip the plugin.  All matching rules are `fleet.api.pvmatch`,
shared with the PV controller.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
import trio

from fleet.api.owners import is_controlled_by
from fleet.api.pvmatch import (
    NO_PROVISIONER,
    SELECTED_NODE,
    WAIT_FOR_FIRST_CONSUMER,
    bind_volume_to_claim,
    claim_class,
    claim_request,
    csinode_has_driver,
    find_matching_volume,
    has_enough_capacity,
    is_claim_bound,
    topology_allows,
    volume_node_affinity_matches,
)
from fleet.client import ApiException
from fleet.scheduler.framework import BindHandle, Code, CycleState, Status
from fleet.scheduler.plugins._cycle import DEFERRED, cycle_snapshot, resolve_deferred
from fleet.scheduler.podinfo import pod_key
from fleet.scheduler.snapshot import NodeInfo, Snapshot

UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
# binder.go's ConflictReasons.
ERR_REASON_BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
ERR_REASON_NODE_CONFLICT = "node(s) had volume node affinity conflict"
ERR_REASON_NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
ERR_REASON_PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
BIND_TIMEOUT = "timed out waiting for the condition"
NAME = "VolumeBinding"


def not_found(name: str) -> str:
    return f'persistentvolumeclaim "{name}" not found'


def pod_claims(pod: dict[str, Any]) -> list[tuple[str, bool]]:
    """(claim name, is a generic ephemeral volume) for every claim-backed volume."""
    md = pod.get("metadata") or {}
    out = []
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(vol, dict):
            continue
        if isinstance(vol.get("persistentVolumeClaim"), dict):
            out.append((str(vol["persistentVolumeClaim"].get("claimName") or ""), False))
        elif isinstance(vol.get("ephemeral"), dict):
            out.append((f"{md.get('name', '')}-{vol.get('name', '')}", True))
    return out


def _delays_binding(pvc: dict[str, Any], snap: Snapshot) -> bool:
    """WaitForFirstConsumer class (IsDelayBindingMode): an unknown class binds immediately."""
    name = claim_class(pvc)
    sc = snap.storage_class(name) if name else None
    return sc is not None and sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER


@dataclass
class PodClaims:
    """The pod's claims, split as GetPodVolumeClaims does."""

    bound: list[dict[str, Any]] = field(default_factory=list)
    delayed: list[dict[str, Any]] = field(default_factory=list)  # unbound WaitForFirstConsumer
    immediate: list[dict[str, Any]] = field(default_factory=list)  # unbound, binding immediately


def classify_claims(pod: dict[str, Any], snap: Snapshot) -> tuple[str | None, PodClaims]:
    """Why the pod's claims keep it off every node (or None), and its claims split."""
    md = pod.get("metadata") or {}
    ns, pod_name = str(md.get("namespace") or ""), str(md.get("name") or "")
    claims = PodClaims()
    for name, ephemeral in pod_claims(pod):
        pvc = snap.pvc(ns, name)
        if pvc is None:
            if ephemeral:
                return f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{name}"', claims
            return not_found(name), claims
        if (pvc.get("status") or {}).get("phase") == "Lost":
            volume = (pvc.get("spec") or {}).get("volumeName") or ""
            return f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{volume}"', claims
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            return f'persistentvolumeclaim "{name}" is being deleted', claims
        if ephemeral and not is_controlled_by(pvc, str(md.get("uid"))):
            return f"PVC {ns}/{name} was not created for pod {ns}/{pod_name} (pod is not owner)", claims
        if is_claim_bound(pvc):
            claims.bound.append(pvc)
        elif _delays_binding(pvc, snap) and not (pvc.get("spec") or {}).get("volumeName"):
            claims.delayed.append(pvc)
        else:
            # Pre-bound (volumeName set) claims are the PV controller's to finish, too.
            claims.immediate.append(pvc)
    return (UNBOUND_IMMEDIATE if claims.immediate else None), claims


def claim_problem(pod: dict[str, Any], snap: Snapshot) -> str | None:
    """Why the pod's claims keep it from being scheduled anywhere, or None."""
    return classify_claims(pod, snap)[0]


@dataclass
class PodVolumes:
    """One node's answer: volumes to bind to claims, and claims to provision there."""

    static_bindings: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)  # (pv, claim)
    provisions: list[dict[str, Any]] = field(default_factory=list)


def _size(claim: dict[str, Any]) -> Decimal:
    return claim_request(claim) or Decimal(0)


def find_pod_volumes(claims: PodClaims, node: NodeInfo,
                     snap: Snapshot) -> tuple[PodVolumes, list[str], str | None]:
    """FindPodVolumes: (what this node would use, the reasons it cannot, an error)."""
    volumes = PodVolumes()
    node_conflict = bind_conflict = not_enough = pv_missing = False

    def result(error: str | None = None) -> tuple[PodVolumes, list[str], str | None]:
        reasons = [r for r, bad in ((ERR_REASON_NODE_CONFLICT, node_conflict),
                                    (ERR_REASON_BIND_CONFLICT, bind_conflict),
                                    (ERR_REASON_NOT_ENOUGH_SPACE, not_enough),
                                    (ERR_REASON_PV_NOT_EXIST, pv_missing)) if bad]
        return volumes, reasons, error

    # Bound claims: their volumes' node affinity (checkBoundClaims).
    for pvc in claims.bound:
        pv = snap.pv(str((pvc.get("spec") or {}).get("volumeName")))
        if pv is None:
            pv_missing = True
            break
        if not volume_node_affinity_matches(pv, node.labels, node.name):
            node_conflict = True
            break
    if not claims.delayed:
        return result()

    to_match, to_provision = [], []
    for pvc in claims.delayed:
        selected = snap.selected_node(pvc)
        if selected is not None:
            if selected != node.name:
                bind_conflict = True  # fast path: provisioning was asked for elsewhere
                return result()
            to_provision.append(pvc)
        else:
            to_match.append(pvc)

    # Static volumes (findMatchingVolumes): smallest claims first, each volume once.
    chosen: set[str] = set()
    for pvc in sorted(to_match, key=_size):
        key = pod_key(pvc)
        pv = find_matching_volume(pvc, snap.pvs_of_class(claim_class(pvc)), node_labels=node.labels,
                                  node_name=node.name, exclude=chosen | snap.promised_pvs(key),
                                  delay_binding=True)
        if pv is None:
            to_provision.append(pvc)
            continue
        chosen.add(str(pv["metadata"]["name"]))
        volumes.static_bindings.append((dict(pv), pvc))

    # The rest must be provisionable on this node (checkVolumeProvisions).
    for pvc in to_provision:
        class_name = claim_class(pvc)
        if not class_name:
            return result(f'no class for claim "{pod_key(pvc)}"')
        sc = snap.storage_class(class_name)
        if sc is None:
            return result(f'failed to find storage class "{class_name}"')
        provisioner = str(sc.get("provisioner") or "")
        if not provisioner or provisioner == NO_PROVISIONER:
            bind_conflict = True
            return result()
        if not topology_allows(sc.get("allowedTopologies"), node.labels):
            bind_conflict = True
            return result()
        driver = snap.csidriver(provisioner)
        if driver is not None and not csinode_has_driver(snap.csinode(node.name), provisioner):
            bind_conflict = True
            return result()
        if not has_enough_capacity(pvc, class_name, driver, snap.capacities_of_class(class_name),
                                   node.labels):
            not_enough = True
            return result()
        volumes.provisions.append(pvc)
    return result()


@dataclass
class _State:
    claims: PodClaims
    by_node: dict[str, PodVolumes] = field(default_factory=dict)
    reserved: PodVolumes | None = None
    reserved_node: str = ""


def _build(pod: dict[str, Any], snap: Snapshot) -> Status | _State | None:
    """The pre-filter's work: a rejection, the pod's claims, or None (nothing per node)."""
    if not snap.pvcs_synced:
        return None
    problem, claims = classify_claims(pod, snap)
    if problem is not None:
        return Status.unschedulable(problem, unresolvable=True)
    if not snap.pvs_synced:
        return None  # PersistentVolumes unknown: nothing per node can be checked
    return _State(claims)


def _claim_key_name(pvc: dict[str, Any]) -> tuple[str, str]:
    md = pvc.get("metadata") or {}
    return str(md.get("namespace") or ""), str(md.get("name") or "")


def _older(seen: Any, before: Any, written: Any) -> bool:
    """The informer's copy predates our write (compare resourceVersions when numeric)."""
    if seen == before and seen != written:
        return True
    try:
        return int(seen) < int(written)
    except (TypeError, ValueError):
        return False


class VolumeBinding:
    name = NAME

    # -- scheduling cycle ---------------------------------------------------------
    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        if not pod_claims(pod):
            return Status(Code.SKIP)
        snap = cycle_snapshot(state)
        if snap is None:
            state.write(NAME, (DEFERRED, pod))  # judged on the first node in filter
            return Status.success()
        built = _build(pod, snap)
        if isinstance(built, Status):
            return built
        if built is None:
            return Status(Code.SKIP)
        state.write(NAME, built)
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        s = resolve_deferred(state, NAME, node, _build, NAME)
        if isinstance(s, Status):
            return s
        if s is None:
            return Status.success()
        snap = node.snapshot
        assert snap is not None, "VolumeBinding needs nodes from a Snapshot"
        volumes, reasons, error = find_pod_volumes(s.claims, node, snap)
        if error is not None:
            return Status.error(error)
        if reasons:
            return Status.unschedulable(*reasons, unresolvable=True)
        s.by_node[node.name] = volumes
        return Status.success()

    # -- binding cycle -------------------------------------------------------------
    @staticmethod
    def _state(state: CycleState) -> _State | None:
        try:
            s = state.read(NAME)
        except KeyError:
            return None
        return s if isinstance(s, _State) else None

    def reserve(self, state: CycleState, pod: dict[str, Any], node: str) -> Status:
        """AssumePodVolumes: promise the node's volumes in the snapshot."""
        s = self._state(state)
        if s is None or not s.claims.delayed:
            return Status.success()  # every claim bound already: nothing to assume
        volumes = s.by_node.get(node)
        snap = state.snapshot
        if volumes is None or snap is None:
            return Status.error(f'no pod volumes found for node "{node}"')
        for pv, pvc in volumes.static_bindings:
            snap.promise_pv(str(pv["metadata"]["name"]), pod_key(pvc))
        for pvc in volumes.provisions:
            snap.assume_selected_node(pod_key(pvc), node)
        s.reserved, s.reserved_node = volumes, node
        return Status.success()

    def unreserve(self, state: CycleState, pod: dict[str, Any], node: str) -> None:
        """RevertAssumedPodVolumes (idempotent)."""
        s = self._state(state)
        snap = state.snapshot
        if s is None or s.reserved is None or snap is None:
            return
        for pv, pvc in s.reserved.static_bindings:
            snap.release_pv(str(pv["metadata"]["name"]), pod_key(pvc))
        for pvc in s.reserved.provisions:
            snap.forget_selected_node(pod_key(pvc), s.reserved_node)
        s.reserved = None

    async def pre_bind(self, state: CycleState, pod: dict[str, Any], node: str,
                       handle: BindHandle) -> Status:
        """BindPodVolumes: the API writes, then wait until every claim is bound."""
        s = self._state(state)
        if s is None or s.reserved is None:
            return Status.success()  # all bound, or nothing reserved for this pod
        volumes = s.reserved
        written: dict[str, tuple[Any, Any]] = {}  # object key -> (rv before, rv after our write)
        try:
            for pv, pvc in volumes.static_bindings:
                new_pv, dirty = bind_volume_to_claim(pv, pvc)
                if dirty:
                    name = str(pv["metadata"]["name"])
                    out = await handle.client.replace("v1", "persistentvolumes", name, new_pv)
                    written["pv/" + name] = ((pv.get("metadata") or {}).get("resourceVersion"),
                                             (out.get("metadata") or {}).get("resourceVersion"))
            for pvc in volumes.provisions:
                ns, name = _claim_key_name(pvc)
                current = handle.snapshot.pvc(ns, name) or pvc
                annotations = (current.get("metadata") or {}).get("annotations") or {}
                if annotations.get(SELECTED_NODE) == node:
                    continue
                new = copy.deepcopy(current)
                new["metadata"]["annotations"] = {**annotations, SELECTED_NODE: node}
                out = await handle.client.replace("v1", "persistentvolumeclaims", name, new, ns)
                written["pvc/" + pod_key(pvc)] = ((current.get("metadata") or {}).get("resourceVersion"),
                                                  (out.get("metadata") or {}).get("resourceVersion"))
        except (ApiException, httpx.HTTPError, OSError) as e:
            return Status.error(str(e))
        with trio.move_on_after(handle.timeout):
            while True:
                done, error = check_bindings(volumes, node, written, handle)
                if error is not None:
                    return Status.error(f"binding volumes: {error}")
                if done:
                    return Status.success()
                await trio.sleep(handle.poll_interval)
        return Status.error(f"binding volumes: {BIND_TIMEOUT}")


def check_bindings(volumes: PodVolumes, node: str, written: dict[str, tuple[Any, Any]],
                   handle: BindHandle) -> tuple[bool, str | None]:
    """checkBindings: (all the pod's volumes bound, why binding must be retried)."""
    snap = handle.snapshot
    info = snap.get(node)
    if info is None:
        return False, f'failed to get node "{node}": node "{node}" not found'
    if not handle.pod_exists():
        return False, "pod does not exist any more"
    for pv, pvc in volumes.static_bindings:
        name = str(pv["metadata"]["name"])
        seen = snap.pv(name)
        ns, claim_name = _claim_key_name(pvc)
        claim = snap.pvc(ns, claim_name)
        if seen is None:
            return False, f'failed to check binding: persistentvolume "{name}" not found'
        if claim is None:
            return False, f'failed to check binding: persistentvolumeclaim "{ns}/{claim_name}" not found'
        before, after = written.get("pv/" + name, (None, None))
        if after is not None and _older((seen.get("metadata") or {}).get("resourceVersion"), before, after):
            return False, None
        if not volume_node_affinity_matches(seen, info.labels, node):
            return False, f"pv \"{name}\" node affinity doesn't match node \"{node}\""
        ref = (seen.get("spec") or {}).get("claimRef") or {}
        if not ref.get("uid"):
            return False, f'ClaimRef got reset for pv "{name}"'
        if not is_claim_bound(claim):
            return False, None
    for pvc in volumes.provisions:
        ns, name = _claim_key_name(pvc)
        claim = snap.pvc(ns, name)
        if claim is None:
            return False, f'failed to check provisioning pvc: persistentvolumeclaim "{ns}/{name}" not found'
        before, after = written.get("pvc/" + pod_key(pvc), (None, None))
        if after is not None and _older((claim.get("metadata") or {}).get("resourceVersion"), before, after):
            return False, None
        annotations = (claim.get("metadata") or {}).get("annotations") or {}
        if annotations.get(SELECTED_NODE) != node:
            # The provisioner removes selected-node when it cannot make the volume there.
            return False, f'provisioning failed for PVC "{name}"'
        volume_name = (claim.get("spec") or {}).get("volumeName")
        if volume_name:
            pv = snap.pv(str(volume_name))
            if pv is None:
                return False, None  # the informer has not shown it yet
            if not volume_node_affinity_matches(pv, info.labels, node):
                return False, f"pv \"{volume_name}\" node affinity doesn't match node \"{node}\""
        if not is_claim_bound(claim):
            return False, None
    return True, None
