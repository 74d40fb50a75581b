"""StatefulSet controller: pods with stable identities and their own storage, in order.

What a StatefulSet promises (kube-controller-manager's statefulset controller):

* **Identity.** Pod `i` is always `<set>-<i>` (from `spec.ordinals.start`), with
  `hostname` = its name and `subdomain` = `spec.serviceName` (so the headless
  Service gives it a stable DNS name), and the labels
  `statefulset.kubernetes.io/pod-name` and `apps.kubernetes.io/pod-index`.
* **Storage.** Each `volumeClaimTemplates` entry becomes one claim per ordinal,
  `<template>-<set>-<i>`, created before the pod and mounted by it.  Claims
  outlive their pods: a deleted or restarted pod `i` gets the same claims back,
  and scaling down keeps them for when the set grows again — unless
  `persistentVolumeClaimRetentionPolicy` says Delete, which is carried out the
  Kubernetes way, through ownerReferences the garbage collector follows: the
  claim is owned by the set (`whenDeleted: Delete`) or, once its ordinal is
  scaled away, by its pod (`whenScaled: Delete`).
* **Order** (`podManagementPolicy: OrderedReady`, the default). Pods are created
  0, 1, 2 … one at a time, each only once every lower ordinal is Running and
  Ready (and available for `minReadySeconds`); scale-down removes the highest
  ordinal first, one at a time, only while the lower ones are healthy.
  `Parallel` drops these waits.
* **Updates.** Every template is snapshotted as a ControllerRevision
  (`fleet.controllers.history`), pods carry the revision's name in
  `controller-revision-hash`.  `RollingUpdate` deletes, from the highest ordinal
  down to `partition`, one pod not at the update revision at a time, waiting for
  the replacement to be Ready; ordinals below the partition stay at (and are
  re-created at) the current revision.  `OnDelete` replaces pods only when the
  user deletes them.  When every pod is updated and ready, `currentRevision`
  becomes the update revision — what `kubectl rollout status` waits for.

The decision is `plan_statefulset(...)`, a pure function of the set, its pods,
the namespace's claims and the two revisions; `StatefulSetController.reconcile`
reads the informer caches, keeps the revision history, applies the plan's
actions in a safe order (claim ownership, then creations, then deletions) and
writes the status.  Pod names are deterministic, so a create racing a stale
cache can only meet a 409; Expectations still keep reconciles from acting
while the controller's own writes are in flight.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api import owners
from fleet.client import MERGE_PATCH, ApiException
from fleet.controllers import history, podstate
from fleet.controllers.runtime import (
    Context,
    Expectations,
    QueueWorker,
    SharedInformer,
    claim_owned,
    controller_key,
    index_claimable,
    key_of,
    split_key,
)

log = logging.getLogger(__name__)

API_VERSION = "apps/v1"
KIND = "StatefulSet"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = history.POD_REVISION_LABEL
RETAIN, DELETE = "Retain", "Delete"
_ORDINAL_RE = re.compile(r"^(.*)-([0-9]+)$")
# How often a set whose own writes have not shown up yet is looked at again.
EXPECTATIONS_RECHECK = 5.0


# ---------------------------------------------------------------------------------------
# Identity


def parent_and_ordinal(name: str) -> tuple[str, int]:
    """("web", 2) for "web-2"; ("", -1) for a name that is not <parent>-<ordinal>."""
    m = _ORDINAL_RE.match(name)
    if not m:
        return "", -1
    return m.group(1), int(m.group(2))


def ordinal_of(pod: Mapping[str, Any]) -> int:
    return parent_and_ordinal(podstate.name_of(pod))[1]


def is_member(sts: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    return parent_and_ordinal(podstate.name_of(pod))[0] == podstate.name_of(sts)


def pod_name(sts: Mapping[str, Any], ordinal: int) -> str:
    return f"{podstate.name_of(sts)}-{ordinal}"


def claim_name(template_name: str, sts_name: str, ordinal: int) -> str:
    return f"{template_name}-{sts_name}-{ordinal}"


def revision_of(pod: Mapping[str, Any]) -> str:
    return podstate.labels_of(pod).get(REVISION_LABEL, "")


def _spec(sts: Mapping[str, Any]) -> dict[str, Any]:
    spec = sts.get("spec")
    return spec if isinstance(spec, dict) else {}


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class Settings:
    """The parts of a StatefulSet's spec the plan needs, with Kubernetes' defaults."""

    replicas: int
    start: int
    monotonic: bool
    rolling: bool
    partition: int
    min_ready: int
    when_deleted: str
    when_scaled: str

    @classmethod
    def of(cls, sts: Mapping[str, Any]) -> Settings:
        spec = _spec(sts)
        strategy = spec.get("updateStrategy") if isinstance(spec.get("updateStrategy"), dict) else {}
        ru = strategy.get("rollingUpdate") if isinstance(strategy.get("rollingUpdate"), dict) else {}
        policy = spec.get("persistentVolumeClaimRetentionPolicy")
        policy = policy if isinstance(policy, dict) else {}
        ordinals = spec.get("ordinals") if isinstance(spec.get("ordinals"), dict) else {}
        return cls(
            replicas=max(0, _int(spec.get("replicas"), 1)),
            start=max(0, _int(ordinals.get("start"))),
            monotonic=spec.get("podManagementPolicy") != "Parallel",
            rolling=(strategy.get("type") or "RollingUpdate") == "RollingUpdate",
            partition=max(0, _int(ru.get("partition"))),
            min_ready=max(0, _int(spec.get("minReadySeconds"))),
            when_deleted=DELETE if policy.get("whenDeleted") == DELETE else RETAIN,
            when_scaled=DELETE if policy.get("whenScaled") == DELETE else RETAIN,
        )

    def in_range(self, ordinal: int) -> bool:
        return self.start <= ordinal < self.start + self.replicas


def claim_templates(sts: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in _spec(sts).get("volumeClaimTemplates") or []
            if isinstance(t, dict) and isinstance(t.get("metadata"), dict) and t["metadata"].get("name")]


def claims_for(sts: Mapping[str, Any], ordinal: int) -> list[dict[str, Any]]:
    """The claims pod `ordinal` mounts, from the templates (getPersistentVolumeClaims)."""
    sts_name = podstate.name_of(sts)
    namespace = (sts.get("metadata") or {}).get("namespace")
    selector_labels = (_spec(sts).get("selector") or {}).get("matchLabels") or {}
    out = []
    for t in claim_templates(sts):
        claim = copy.deepcopy(t)
        md = claim["metadata"]
        md["name"] = claim_name(str(md["name"]), sts_name, ordinal)
        md["namespace"] = namespace
        md["labels"] = {**(md.get("labels") or {}), **selector_labels}
        for f in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences", "generation"):
            md.pop(f, None)
        claim.pop("status", None)
        claim["apiVersion"], claim["kind"] = "v1", "PersistentVolumeClaim"
        out.append(claim)
    return out


def new_pod(sts: Mapping[str, Any], template: Mapping[str, Any], revision: str, ordinal: int) -> dict[str, Any]:
    """Pod `ordinal` from `template`, with its identity, storage and revision label."""
    md = sts.get("metadata") or {}
    pod = podstate.pod_from_template(template, str(md.get("namespace") or ""),
                                     owners.controller_ref(sts, api_version=API_VERSION, kind=KIND))
    name = pod_name(sts, ordinal)
    pod["metadata"]["name"] = name
    labels = pod["metadata"]["labels"]
    labels[POD_NAME_LABEL] = name
    labels[POD_INDEX_LABEL] = str(ordinal)
    labels[REVISION_LABEL] = revision
    spec = pod["spec"]
    spec["hostname"] = name
    service = _spec(sts).get("serviceName")
    if service:
        spec["subdomain"] = service
    templates = claim_templates(sts)
    if templates:
        names = {str(t["metadata"]["name"]) for t in templates}
        claims = [{"name": str(t["metadata"]["name"]),
                   "persistentVolumeClaim": {"claimName": claim_name(str(t["metadata"]["name"]),
                                                                     podstate.name_of(sts), ordinal)}}
                  for t in templates]
        others = [vol for vol in spec.get("volumes") or [] if isinstance(vol, dict) and vol.get("name") not in names]
        spec["volumes"] = claims + others
    return pod


def identity_labels(sts: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """Identity labels the pod lacks (updateIdentity), {} when it has them."""
    name, ordinal = podstate.name_of(pod), ordinal_of(pod)
    want = {POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal)}
    have = podstate.labels_of(pod)
    return {k: val for k, val in want.items() if have.get(k) != val}


# ---------------------------------------------------------------------------------------
# Claim ownership for persistentVolumeClaimRetentionPolicy


def _matches_ref(ref: Mapping[str, Any], api_version: str, kind: str, name: str) -> bool:
    return ref.get("apiVersion") == api_version and ref.get("kind") == kind and ref.get("name") == name


def _ref_key(refs: Iterable[Mapping[str, Any]]) -> list[tuple[str, bool, bool]]:
    return sorted((str(r.get("uid")), bool(r.get("controller")), bool(r.get("blockOwnerDeletion")))
                  for r in refs)


def claim_owner_refs(claim: Mapping[str, Any], sts: Mapping[str, Any], pod: Mapping[str, Any],
                     settings: Settings) -> list[dict[str, Any]] | None:
    """The ownerReferences `claim` should have under the retention policy, or None if it has them.

    Retain/Retain: no reference from us.  whenDeleted=Delete: owned by the set
    (deleting the set deletes the claim).  whenScaled=Delete: owned by its pod
    once that pod's ordinal is out of range (deleting the pod deletes the
    claim); when both are Delete the pod takes over from the set on scale-down.
    A reference to an older set or pod of the same name (another uid) means the
    claim belongs to a previous incarnation: it is left for the garbage collector.
    Another controller owning the claim wins: our references are removed.
    """
    refs = [dict(r) for r in (claim.get("metadata") or {}).get("ownerReferences") or [] if isinstance(r, dict)]
    sts_name, pod_name_ = podstate.name_of(sts), podstate.name_of(pod)
    sts_uid, pod_uid = podstate.uid_of(sts), podstate.uid_of(pod)
    for r in refs:
        if _matches_ref(r, API_VERSION, KIND, sts_name) and r.get("uid") != sts_uid:
            return None
        if _matches_ref(r, "v1", "Pod", pod_name_) and r.get("uid") != pod_uid:
            return None

    def ours(r: Mapping[str, Any]) -> bool:
        return _matches_ref(r, API_VERSION, KIND, sts_name) or _matches_ref(r, "v1", "Pod", pod_name_)

    others = [r for r in refs if not ours(r)]
    want = list(others)
    retain_all = settings.when_deleted == RETAIN and settings.when_scaled == RETAIN
    if retain_all or not any(r.get("controller") for r in others):
        in_range = settings.in_range(ordinal_of(pod))
        if settings.when_deleted == DELETE and (settings.when_scaled == RETAIN or in_range):
            want.append(owners.controller_ref(sts, api_version=API_VERSION, kind=KIND))
        if settings.when_scaled == DELETE and not in_range and pod_uid:
            want.append(owners.controller_ref(pod, api_version="v1", kind="Pod"))
    return None if _ref_key(want) == _ref_key(refs) else want


def claim_is_stale(claim: Mapping[str, Any], pod_name_: str, settings: Settings) -> bool:
    """A claim still owned by a deleted pod of this name is about to be garbage collected
    (whenScaled=Delete): the new pod must wait for it to go rather than mount it."""
    if settings.when_scaled != DELETE:
        return False
    return any(isinstance(r, dict) and _matches_ref(r, "v1", "Pod", pod_name_)
               for r in (claim.get("metadata") or {}).get("ownerReferences") or [])


# ---------------------------------------------------------------------------------------
# The plan


@dataclass
class PodCreation:
    pod: dict[str, Any]
    claims: list[dict[str, Any]]  # the pod's claims that do not exist yet, created first


@dataclass
class StatefulSetPlan:
    create: list[PodCreation] = field(default_factory=list)
    delete: list[dict[str, Any]] = field(default_factory=list)
    # Claims of existing pending pods that went missing (re-created so the pod can start).
    missing_claims: list[dict[str, Any]] = field(default_factory=list)
    # (claim, new ownerReferences) for the retention policy; applied before any deletion.
    claim_refs: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    # (pod, labels to set) to restore identity labels.
    relabel: list[tuple[dict[str, Any], dict[str, str]]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    waiting: str = ""  # why nothing more happens now (logs and tests)
    requeue_after: float | None = None  # when a pod becomes available (minReadySeconds)


def _unavailable(pod: Mapping[str, Any] | None, s: Settings, now: float) -> bool:
    if pod is None or podstate.is_terminating(pod):
        return True
    return not (podstate.is_running_and_ready(pod) and podstate.is_available(pod, s.min_ready, now))


def compute_status(sts: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], current: str, update: str,
                   collision_count: int, s: Settings, now: float) -> dict[str, Any]:
    """StatefulSetStatus from the pods (updateStatus + completeRollingUpdate)."""
    replicas = ready = available = cur = upd = 0
    for pod in pods:
        created = bool(podstate.phase(pod))
        if created:
            replicas += 1
        if podstate.is_running_and_ready(pod):
            ready += 1
            if podstate.is_available(pod, s.min_ready, now):
                available += 1
        if created and not podstate.is_terminating(pod):
            rev = revision_of(pod)
            cur += rev == current
            upd += rev == update
    status = {
        "observedGeneration": _int((sts.get("metadata") or {}).get("generation")),
        "replicas": replicas, "readyReplicas": ready, "availableReplicas": available,
        "currentReplicas": cur, "updatedReplicas": upd,
        "currentRevision": current, "updateRevision": update, "collisionCount": collision_count,
    }
    if s.rolling and upd == s.replicas and ready == s.replicas and replicas == s.replicas:
        # The rollout is complete: the update revision becomes the current one.
        status["currentReplicas"] = upd
        status["currentRevision"] = update
    return status


def plan_statefulset(sts: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                     claims: Mapping[str, Mapping[str, Any]], current_rev: Mapping[str, Any],
                     update_rev: Mapping[str, Any], collision_count: int, now: float) -> StatefulSetPlan:
    """What to do next for `sts` (stateful_set_control.go's updateStatefulSet), pure.

    `pods` are the set's own pods, `claims` the namespace's claims by name,
    `now` the wall-clock time (for minReadySeconds).  In OrderedReady mode the
    plan stops at the first step that has to wait, as Kubernetes does.
    """
    s = Settings.of(sts)
    cur_name = podstate.name_of(current_rev)
    upd_name = podstate.name_of(update_rev)
    cur_template, upd_template = history.template_of(current_rev), history.template_of(update_rev)
    ordinals = list(range(s.start, s.start + s.replicas))
    slots: dict[int, dict[str, Any] | None] = {o: None for o in ordinals}
    condemned: list[dict[str, Any]] = []
    for pod in pods:
        o = ordinal_of(pod)
        if o < 0:
            continue
        if s.in_range(o):
            slots[o] = dict(pod)
        else:
            condemned.append(dict(pod))
    condemned.sort(key=ordinal_of, reverse=True)
    plan = StatefulSetPlan()
    plan.status = compute_status(sts, [*(p for p in slots.values() if p), *condemned],
                                 cur_name, upd_name, collision_count, s, now)
    waits_for_availability = [
        at for p in (*slots.values(), *condemned) if p is not None and not podstate.is_terminating(p)
        for at in [podstate.available_at(p, s.min_ready)] if at is not None and at > now]
    if waits_for_availability:
        plan.requeue_after = max(0.5, min(waits_for_availability) - now)
    if podstate.is_terminating(sts):
        plan.waiting = "the StatefulSet is being deleted"
        return plan

    # The lowest unavailable pod (a missing one counts) may be scaled down although unhealthy.
    first_unavailable: str | None = None
    for o in ordinals:
        if _unavailable(slots[o], s, now):
            first_unavailable = podstate.name_of(slots[o]) if slots[o] else pod_name(sts, o)
            break
    else:
        for p in reversed(condemned):
            if _unavailable(p, s, now):
                first_unavailable = podstate.name_of(p)
                break

    def wait(why: str) -> StatefulSetPlan:
        plan.waiting = why
        return plan

    # 1. Every ordinal in range: replace finished pods, create missing ones, then
    #    (in order) wait for each to be Running, Ready and available.
    for o in ordinals:
        pod = slots[o]
        name = pod_name(sts, o)
        if pod is not None and podstate.is_finished(pod):
            if not podstate.is_terminating(pod):
                plan.delete.append(pod)
            if s.monotonic:
                return wait(f"pod {name} has finished and is being replaced")
            continue
        if pod is None:
            use_current = s.rolling and o < s.start + s.partition
            template, rev = (cur_template, cur_name) if use_current else (upd_template, upd_name)
            pod = new_pod(sts, template, rev, o)
            needed = claims_for(sts, o)
            blocked = [c for c in needed if c["metadata"]["name"] in claims
                       and (podstate.is_terminating(claims[c["metadata"]["name"]])
                            or claim_is_stale(claims[c["metadata"]["name"]], name, s))]
            if blocked:
                if s.monotonic:
                    return wait(f"claim {podstate.name_of(blocked[0])} of pod {name} is being deleted")
                continue
            missing = []
            for c in needed:
                if c["metadata"]["name"] in claims:
                    continue
                refs = claim_owner_refs(c, sts, pod, s)
                if refs:
                    c["metadata"]["ownerReferences"] = refs
                missing.append(c)
            plan.create.append(PodCreation(pod, missing))
            slots[o] = pod
            if s.monotonic:
                return wait(f"pod {name} is being created")
            continue
        if podstate.phase(pod) == "Pending":
            plan.missing_claims.extend(c for c in claims_for(sts, o) if c["metadata"]["name"] not in claims)
        if s.monotonic:
            if podstate.is_terminating(pod):
                return wait(f"pod {name} is terminating")
            if not podstate.is_running_and_ready(pod):
                return wait(f"pod {name} is not Running and Ready")
            if not podstate.is_available(pod, s.min_ready, now):
                return wait(f"pod {name} is not available yet (minReadySeconds)")
        labels = identity_labels(sts, pod)
        if labels:
            plan.relabel.append((pod, labels))
        _fix_claims(plan, sts, pod, claims, s)

    # 2. Scaled-away pods: their claims change hands first (whenScaled=Delete), then
    #    they go, highest ordinal first.
    for pod in condemned:
        _fix_claims(plan, sts, pod, claims, s)
    for pod in condemned:
        name = podstate.name_of(pod)
        if podstate.is_terminating(pod):
            if s.monotonic:
                return wait(f"pod {name} is terminating before scale-down continues")
            continue
        if s.monotonic and name != first_unavailable and _unavailable(pod, s, now):
            return wait(f"pod {first_unavailable} must be healthy before {name} is scaled down")
        plan.delete.append(pod)
        if s.monotonic:
            return wait(f"pod {name} is being deleted for scale-down")

    # 3. Updates: OnDelete leaves it to the user; RollingUpdate replaces the highest
    #    ordinal not yet at the update revision, one at a time, down to the partition.
    if not s.rolling:
        return plan
    going = {podstate.uid_of(p) for p in plan.delete}
    for o in reversed(ordinals):
        if o < s.start + s.partition:
            break
        pod = slots[o]
        if pod is None or podstate.uid_of(pod) in going:
            return wait(f"pod {pod_name(sts, o)} is being replaced")
        if revision_of(pod) != upd_name and not podstate.is_terminating(pod):
            plan.delete.append(pod)
            return wait(f"pod {podstate.name_of(pod)} is being replaced by the update revision")
        if _unavailable(pod, s, now):
            return wait(f"pod {podstate.name_of(pod)} of the update revision is not available yet")
    return plan


def _fix_claims(plan: StatefulSetPlan, sts: Mapping[str, Any], pod: Mapping[str, Any],
                claims: Mapping[str, Mapping[str, Any]], s: Settings) -> None:
    if not podstate.uid_of(pod):
        return
    for c in claims_for(sts, ordinal_of(pod)):
        existing = claims.get(c["metadata"]["name"])
        if existing is None:
            continue
        refs = claim_owner_refs(existing, sts, pod, s)
        if refs is not None:
            plan.claim_refs.append((dict(existing), refs))


def status_changed(sts: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    have = sts.get("status") or {}
    return any(have.get(k, 0 if isinstance(val, int) else None) != val for k, val in status.items())


# ---------------------------------------------------------------------------------------
# The controller


class StatefulSetController(QueueWorker):
    name = "statefulset"
    workers = 2

    def __init__(self) -> None:
        super().__init__()
        self.expectations = Expectations()

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.sets: SharedInformer = ctx.informers.informer(API_VERSION, "statefulsets")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.claims: SharedInformer = ctx.informers.informer("v1", "persistentvolumeclaims")
        self.revisions: SharedInformer = ctx.informers.informer(API_VERSION, "controllerrevisions")
        for inf in (self.pods, self.revisions):
            index_claimable(inf)
        self.sets.add_handler(self._on_set)
        self.pods.add_handler(self._on_pod)
        self.claims.add_handler(self._on_claim)
        self.revisions.add_handler(self._on_revision)

    # -- event handlers: map every change to the set(s) it concerns ---------------------
    def _on_set(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        if etype == "DELETED":
            self.expectations.forget(key_of(obj))
        self.queue.add(key_of(obj))

    @staticmethod
    def _owner_key(obj: Mapping[str, Any] | None) -> str | None:
        return controller_key(obj, API_VERSION, KIND)

    def _sets_selecting(self, pod: Mapping[str, Any]) -> list[str]:
        ns = (pod.get("metadata") or {}).get("namespace") or ""
        labels = podstate.labels_of(pod)
        return [key_of(s) for s in self.sets.list(ns)
                if podstate.selector_matches(_spec(s).get("selector"), labels)]

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        if pod is None:
            return
        key = self._owner_key(pod)
        if etype == "ADDED" and key:
            self.expectations.creation_observed(key)
        if key and (etype == "DELETED" or (podstate.is_terminating(pod)
                                          and not (old is not None and podstate.is_terminating(old)))):
            self.expectations.deletion_observed(key, podstate.uid_of(pod))
        old_key = self._owner_key(old)
        for k in {key, old_key} - {None}:
            self.queue.add(k)  # type: ignore[arg-type]
        if key is None and etype != "DELETED" and not podstate.is_terminating(pod):
            for k in self._sets_selecting(pod):  # an orphan this set may adopt
                self.queue.add(k)

    def _on_claim(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        c = new if new is not None else old
        if c is None:
            return
        md = c.get("metadata") or {}
        ns, cname = md.get("namespace") or "", str(md.get("name") or "")
        for s in self.sets.list(ns):
            sname = podstate.name_of(s)
            if any(cname.startswith(f"{t['metadata']['name']}-{sname}-") for t in claim_templates(s)):
                self.queue.add(key_of(s))

    def _on_revision(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for obj in (old, new):
            key = self._owner_key(obj)
            if key:
                self.queue.add(key)

    # -- reconcile ------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        sts = self.sets.get(key)
        if sts is None:
            self.expectations.forget(key)
            return None
        selector = _spec(sts).get("selector")
        if not isinstance(selector, dict) or not podstate.uid_of(sts):
            return None
        if not self.expectations.satisfied(key):
            return EXPECTATIONS_RECHECK
        ns, _ = split_key(key)
        pods = await self._claim_pods(sts, ns)
        revisions = history.sort_revisions(await self._claim_revisions(sts, ns))
        collision = _int((sts.get("status") or {}).get("collisionCount"))
        update_rev, collision = await self._update_revision(sts, revisions, collision)
        current_name = (sts.get("status") or {}).get("currentRevision")
        current_rev = next((r for r in revisions if podstate.name_of(r) == current_name), update_rev)
        claims = {podstate.name_of(c): c for c in self.claims.list(ns)}
        plan = plan_statefulset(sts, pods, claims, current_rev, update_rev, collision, time.time())
        if plan.waiting:
            log.debug("statefulset %s: %s", key, plan.waiting)
        try:
            await self._apply(key, sts, plan)
        finally:
            await self._write_status(sts, plan.status)
        await self._truncate_history(sts, pods, [*revisions, update_rev], current_rev, update_rev)
        return plan.requeue_after

    async def _claim_pods(self, sts: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        """The set's pods, after adopting matching orphans and releasing what no longer matches."""
        def matches(pod: dict[str, Any]) -> bool:
            return is_member(sts, pod) and podstate.selector_matches(_spec(sts).get("selector"),
                                                                     podstate.labels_of(pod))
        return await claim_owned(self.ctx.client, self.pods, sts, ns, matches,
                                 api_version=API_VERSION, kind=KIND, resource=("v1", "pods"))

    async def _claim_revisions(self, sts: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        return await claim_owned(
            self.ctx.client, self.revisions, sts, ns,
            lambda r: podstate.selector_matches(_spec(sts).get("selector"), podstate.labels_of(r)),
            api_version=API_VERSION, kind=KIND, resource=(API_VERSION, "controllerrevisions"),
            release=False)

    async def _update_revision(self, sts: dict[str, Any], revisions: list[dict[str, Any]],
                               collision: int) -> tuple[dict[str, Any], int]:
        """The revision of the live template: found, renumbered (a rollback) or created."""
        ns = (sts.get("metadata") or {}).get("namespace") or ""
        data = history.template_patch(sts)
        choice, rev, n = history.choose_update_revision(revisions, data)
        if choice == "existing" and rev is not None:
            return rev, collision
        if choice == "renumber" and rev is not None:
            return await self.ctx.client.patch(API_VERSION, "controllerrevisions", podstate.name_of(rev),
                                               {"revision": n}, MERGE_PATCH, ns), collision
        hash_ = history.hash_data(data, collision)
        template_labels = ((_spec(sts).get("template") or {}).get("metadata") or {}).get("labels") or {}
        body = history.build_revision(
            sts, owners.controller_ref(sts, api_version=API_VERSION, kind=KIND), data, n,
            name=history.revision_name(podstate.name_of(sts), hash_),
            labels={**template_labels, history.REVISION_HASH_LABEL: hash_},
            annotations=(sts.get("metadata") or {}).get("annotations"))
        try:
            return await self.ctx.client.create(API_VERSION, "controllerrevisions", body, ns), collision
        except ApiException as e:
            if e.code != 409:
                raise
        existing = await self.ctx.client.get_object(API_VERSION, "controllerrevisions",
                                                    body["metadata"]["name"], ns)
        if history.same_data(existing, data) and owners.is_controlled_by(existing, podstate.uid_of(sts)):
            return existing, collision
        # Two templates hash alike: count the collision (it salts the next hash) and retry.
        await self.ctx.client.patch(API_VERSION, "statefulsets", podstate.name_of(sts),
                                    {"status": {"collisionCount": collision + 1}}, MERGE_PATCH, ns,
                                    subresource="status")
        raise RuntimeError(f"revision name {body['metadata']['name']} collides; collisionCount raised")

    async def _apply(self, key: str, sts: dict[str, Any], plan: StatefulSetPlan) -> None:
        ns, name = split_key(key)
        client, events = self.ctx.client, self.ctx.events
        for claim, refs in plan.claim_refs:
            try:
                await client.patch("v1", "persistentvolumeclaims", podstate.name_of(claim),
                                   {"metadata": {"ownerReferences": refs or None,
                                                 "resourceVersion": (claim.get("metadata") or {}).get(
                                                     "resourceVersion")}}, MERGE_PATCH, ns)
            except ApiException as e:
                if e.code != 404:
                    raise
        for pod, labels in plan.relabel:
            try:
                await client.patch("v1", "pods", podstate.name_of(pod), {"metadata": {"labels": labels}},
                                   MERGE_PATCH, ns)
            except ApiException as e:
                if e.code != 404:
                    raise
        for claim in plan.missing_claims:
            await self._create_claim(sts, claim, podstate.name_of(claim))
        for creation in plan.create:
            pname = podstate.name_of(creation.pod)
            for claim in creation.claims:
                await self._create_claim(sts, claim, pname)
            self.expectations.expect_creations(key, 1)
            try:
                await client.create("v1", "pods", creation.pod, ns)
            except ApiException as e:
                self.expectations.creation_failed(key)
                if e.code == 409:
                    continue  # our cache was behind: it exists
                events.record(sts, "Warning", "FailedCreate",
                              f"create Pod {pname} in StatefulSet {name} failed error: {e}")
                raise
            except BaseException:
                self.expectations.creation_failed(key)
                raise
            events.record(sts, "Normal", "SuccessfulCreate", f"create Pod {pname} in StatefulSet {name} successful")
        for pod in plan.delete:
            pname, uid = podstate.name_of(pod), podstate.uid_of(pod)
            self.expectations.expect_deletions(key, [uid])
            try:
                await client.delete("v1", "pods", pname, ns, body={"preconditions": {"uid": uid}})
            except ApiException as e:
                self.expectations.deletion_observed(key, uid)
                if e.code in (404, 409):
                    continue  # already gone (or a newer pod of that name)
                events.record(sts, "Warning", "FailedDelete",
                              f"delete Pod {pname} in StatefulSet {name} failed error: {e}")
                raise
            except BaseException:
                self.expectations.deletion_observed(key, uid)
                raise
            events.record(sts, "Normal", "SuccessfulDelete", f"delete Pod {pname} in StatefulSet {name} successful")

    async def _create_claim(self, sts: dict[str, Any], claim: dict[str, Any], pod: str) -> None:
        ns = (claim.get("metadata") or {}).get("namespace") or ""
        cname, sname = podstate.name_of(claim), podstate.name_of(sts)
        try:
            await self.ctx.client.create("v1", "persistentvolumeclaims", claim, ns)
        except ApiException as e:
            if e.code != 409:
                self.ctx.events.record(sts, "Warning", "FailedCreate",
                                       f"create Claim {cname} for Pod {pod} in StatefulSet {sname} "
                                       f"failed error: {e}")
                raise
            existing = await self.ctx.client.get_object("v1", "persistentvolumeclaims", cname, ns)
            if podstate.is_terminating(existing):
                raise RuntimeError(f"pvc {cname} is being deleted") from None
            return
        self.ctx.events.record(sts, "Normal", "SuccessfulCreate",
                               f"create Claim {cname} Pod {pod} in StatefulSet {sname} success")

    async def _write_status(self, sts: dict[str, Any], status: dict[str, Any]) -> None:
        if not status or not status_changed(sts, status):
            return
        ns = (sts.get("metadata") or {}).get("namespace") or ""
        try:
            await self.ctx.client.patch(API_VERSION, "statefulsets", podstate.name_of(sts),
                                        {"status": status}, MERGE_PATCH, ns, subresource="status")
        except ApiException as e:
            if e.code != 404:
                raise

    async def _truncate_history(self, sts: dict[str, Any], pods: list[dict[str, Any]],
                                revisions: list[dict[str, Any]], current: Mapping[str, Any],
                                update: Mapping[str, Any]) -> None:
        live = {podstate.name_of(current), podstate.name_of(update), *(revision_of(p) for p in pods)}
        unique = {podstate.name_of(r): r for r in revisions}
        limit = _int(_spec(sts).get("revisionHistoryLimit"), 10)
        ns = (sts.get("metadata") or {}).get("namespace") or ""
        for r in history.history_to_delete(list(unique.values()), live, limit):
            try:
                await self.ctx.client.delete(API_VERSION, "controllerrevisions", podstate.name_of(r), ns)
            except ApiException as e:
                if e.code != 404:
                    raise
