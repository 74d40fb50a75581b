"""Deployment controller: roll a pod template out through ReplicaSets.

As kube-controller-manager's deployment controller.  A Deployment owns one
ReplicaSet per template it has had (named `<deployment>-<pod-template-hash>`, the
hash also a label on the ReplicaSet's selector and pods, so generations never
select each other's pods); a rollout is moving replicas from the old ReplicaSets
to the new one.  The decision is `plan(deployment, replicasets, pods, now=...)`,
this module, pure and tested table-driven; `DeploymentController`
(`fleet/controllers/deployment.py`) is the thin I/O loop, and the arithmetic,
hashes and conditions it decides with are `fleet/controllers/deployment_util.py`.

One pass, in Kubernetes' order:

1. **Claim** ReplicaSets: adopt orphans the selector matches, release owned ones
   it no longer matches.
2. **Paused** (`spec.paused`) — or a **scaling event** (spec.replicas differs from
   what an active ReplicaSet's `deployment.kubernetes.io/desired-replicas` says)
   — only resize: one active ReplicaSet takes the whole count; several share a
   change in proportion to their size (`proportional_scale`), so scaling in the
   middle of a rollout neither speeds it up nor breaks maxSurge.
3. Otherwise the **strategy**:
   - *RollingUpdate*: the new ReplicaSet grows while the total stays within
     `replicas + maxSurge` (rounded up from a percentage); old ReplicaSets shrink
     while the available pods stay at or above `replicas - maxUnavailable`
     (rounded down) — first their unavailable pods, then available ones.  Both
     zero after rounding means maxUnavailable 1, or nothing could ever move.
   - *Recreate*: old ReplicaSets go to 0, and the new one is created only once
     no old pod is left at all (terminating ones included).
4. **History**: the new ReplicaSet gets revision max(old)+1 (an old one brought
   back by a rollback keeps its previous numbers in
   `deployment.kubernetes.io/revision-history`); the Deployment carries the
   current revision; once a rollout is complete (or while paused), old
   ReplicaSets with no pods beyond `revisionHistoryLimit` are deleted, oldest
   revision first.
5. **Status**: replica counts (`updatedReplicas` are the new ReplicaSet's pods),
   `observedGeneration`, Available (MinimumReplicasAvailable /
   MinimumReplicasUnavailable) and Progressing: NewReplicaSetCreated,
   FoundNewReplicaSet, ReplicaSetUpdated each time a count moves forward,
   NewReplicaSetAvailable when complete, ProgressDeadlineExceeded once
   `progressDeadlineSeconds` pass without progress — which is what makes `kubectl
   rollout status` give up.  The pass asks to be run again when the deadline would
   fall.

Rollback is kubectl's own (client side since 1.x): `kubectl rollout undo` copies an
old ReplicaSet's template back into the Deployment, which then finds that
ReplicaSet as its "new" one and scales it up under a fresh revision.

The template hash is FNV-32a over the template's canonical JSON plus
`status.collisionCount`, encoded like Kubernetes' (digits mapped onto
"bcdfghjklmnpqrstvwxz2456789"); the values differ from Kubernetes' own (theirs
hashes Go's in-memory structure) but have the same shape and the same role — the
new ReplicaSet is found by comparing templates, never by hash.  A name already
taken by a ReplicaSet that is not this template's bumps `collisionCount`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api import owners
from fleet.controllers.deployment_util import (
    API_VERSION,
    DESIRED_REPLICAS,
    FOUND_NEW_RS,
    HASH_LABEL,
    KIND,
    MAX_REPLICAS,
    MAX_REVISION_HISTORY_CHARS,
    MIN_AVAILABLE,
    MIN_UNAVAILABLE,
    NEW_RS_AVAILABLE,
    NEW_RS_CREATED,
    PAUSED,
    RESUMED,
    REVISION,
    REVISION_HISTORY,
    RS_CREATE_ERROR,
    RS_UPDATED,
    SKIP_COPY,
    TIMED_OUT,
    Obj,
    annotations_of,
    created_order,
    deployment_complete,
    deployment_progressing,
    deployment_timed_out,
    equal_ignore_hash,
    get_condition,
    has_deadline,
    is_rolling,
    max_surge,
    max_unavailable,
    new_condition,
    remove_condition,
    replicas_of,
    revision,
    rs_replicas,
    rs_status,
    set_condition,
    spec_of,
    template_hash,
)
from fleet.controllers.replicaset import meta, parse_time, rfc3339, selects


@dataclass
class RSWrite:
    """A ReplicaSet to write whole (PUT with the resourceVersion it was read at) and the
    event to record once it is written."""

    rs: Obj
    event: str | None = None


@dataclass
class DeploymentPlan:
    adopt: list[Obj] = field(default_factory=list)      # orphan ReplicaSets to own
    release: list[Obj] = field(default_factory=list)    # owned, no longer selected
    create: RSWrite | None = None                        # the new ReplicaSet
    update: list[RSWrite] = field(default_factory=list)  # ReplicaSets resized / annotated
    delete: list[Obj] = field(default_factory=list)      # history beyond the limit
    annotations: dict[str, str] | None = None            # the Deployment's new revision
    status: Obj | None = None                            # None: unchanged
    events: list[tuple[str, str, str]] = field(default_factory=list)
    requeue_after: float | None = None


class _Planner:
    """One pass of Kubernetes' syncDeployment over working copies; no I/O."""

    def __init__(self, d: Mapping[str, Any], replicasets: Iterable[Mapping[str, Any]],
                 pods: Iterable[Mapping[str, Any]], now: float) -> None:
        self.d = copy.deepcopy(dict(d))
        self.name = str(meta(d).get("name"))
        self.now = now
        self.replicas = replicas_of(d)
        self.status: Obj = copy.deepcopy(dict(d.get("status") or {}))
        self.out = DeploymentPlan()
        self.all_in_namespace = [dict(rs) for rs in replicasets]
        self.pods = [dict(p) for p in pods]
        self._dirty: dict[str, Obj] = {}
        self._events: dict[str, str] = {}
        self._created: Obj | None = None
        self.rses: list[Obj] = self._claim()

    # -- claiming ---------------------------------------------------------------------------
    def _claim(self) -> list[Obj]:
        mine, self.out.adopt, self.out.release = owners.claim(
            self.d, self.all_in_namespace, lambda rs: selects(self.d, rs))
        owned = [copy.deepcopy(rs) for rs in mine]
        for rs in self.out.adopt:  # counted as adopted already; the writes follow the plan
            taken = copy.deepcopy(rs)
            taken["metadata"]["ownerReferences"] = [*(meta(rs).get("ownerReferences") or []), self._ref()]
            owned.append(taken)
        owned.sort(key=created_order)
        return owned

    def _ref(self) -> Obj:
        return owners.controller_ref(self.d, api_version=API_VERSION, kind=KIND)

    # -- bookkeeping ------------------------------------------------------------------------
    def _touch(self, rs: Obj, event: str | None = None) -> None:
        name = str(meta(rs).get("name"))
        if rs is self._created:
            if event:
                self.out.events.append(("Normal", "ScalingReplicaSet", event))
            return
        self._dirty[name] = rs
        if event:
            self._events[name] = event

    def _find_new(self) -> Obj | None:
        template = spec_of(self.d).get("template")
        for rs in sorted(self.rses, key=created_order):
            if equal_ignore_hash(spec_of(rs).get("template"), template):
                return rs
        return None

    def _old(self, new: Obj | None) -> list[Obj]:
        return [rs for rs in self.rses if rs is not new]

    # -- revisions and the new ReplicaSet ---------------------------------------------------
    def _set_new_rs_annotations(self, rs: Obj, new_revision: int, exists: bool) -> bool:
        ann = annotations_of(rs)
        changed = False
        for k, v in (meta(self.d).get("annotations") or {}).items():
            if k in SKIP_COPY or ann.get(k) == v:
                continue
            ann[k] = v
            changed = True
        old_text = ann.get(REVISION)
        try:
            old_rev = int(old_text) if old_text else 0
        except ValueError:
            return changed
        if old_rev < new_revision:
            ann[REVISION] = str(new_revision)
            changed = True
            if old_text:
                # Brought back by a rollback: remember the numbers it had.
                history = [h for h in str(ann.get(REVISION_HISTORY, "")).split(",") if h]
                history.append(old_text)
                while history and len(",".join(history)) > MAX_REVISION_HISTORY_CHARS:
                    history.pop(0)
                ann[REVISION_HISTORY] = ",".join(history)
        if not exists and self._set_replicas_annotations(rs):
            changed = True
        return changed

    def _set_replicas_annotations(self, rs: Obj) -> bool:
        ann = annotations_of(rs)
        want = {DESIRED_REPLICAS: str(self.replicas),
                MAX_REPLICAS: str(self.replicas + max_surge(self.d))}
        if all(ann.get(k) == v for k, v in want.items()):
            return False
        ann.update(want)
        return True

    def _set_deployment_revision(self, rev: str | None) -> None:
        if rev is None:
            return
        current = (meta(self.d).get("annotations") or {}).get(REVISION)
        if current != rev:
            annotations_of(self.d)[REVISION] = rev
            self.out.annotations = {REVISION: rev}

    def sync_revision(self, create: bool) -> tuple[Obj | None, list[Obj]]:
        """Kubernetes' getAllReplicaSetsAndSyncRevision: the new ReplicaSet (created
        when `create` and missing) and the old ones, revisions brought up to date."""
        new = self._find_new()
        old = self._old(new)
        new_revision = max((revision(rs) for rs in old), default=0) + 1
        if new is not None:
            changed = self._set_new_rs_annotations(new, new_revision, exists=True)
            min_ready = int(spec_of(self.d).get("minReadySeconds") or 0)
            if int(spec_of(new).get("minReadySeconds") or 0) != min_ready:
                new["spec"]["minReadySeconds"] = min_ready
                changed = True
            if changed:
                self._touch(new)
            self._set_deployment_revision((meta(new).get("annotations") or {}).get(REVISION))
            if has_deadline(self.d) and get_condition(self.status, "Progressing") is None:
                set_condition(self.status, new_condition(
                    "Progressing", "True", FOUND_NEW_RS,
                    f'Found new replica set "{meta(new).get("name")}"', self.now))
            return new, old
        if not create or self._created is not None:
            return self._created, old
        return self._create_new(old, new_revision)

    def _create_new(self, old: list[Obj], new_revision: int) -> tuple[Obj | None, list[Obj]]:
        template = copy.deepcopy(spec_of(self.d).get("template") or {})
        collisions = self.status.get("collisionCount")
        h = template_hash(template, collisions)
        name = f"{self.name}-{h}"
        taken = [rs for rs in self.all_in_namespace if meta(rs).get("name") == name]
        if taken:
            # Someone else's ReplicaSet (or another template's) has the name: change the
            # hash with the collision count, and try again on the next pass.
            self.status["collisionCount"] = int(collisions or 0) + 1
            self.out.requeue_after = 0.0
            return None, old
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: h}
        selector = copy.deepcopy(spec_of(self.d).get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: h}
        rs: Obj = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": meta(self.d).get("namespace"),
                         "labels": dict(tmeta["labels"]),
                         "ownerReferences": [self._ref()],
                         "creationTimestamp": rfc3339(self.now)},
            "spec": {"replicas": 0, "minReadySeconds": int(spec_of(self.d).get("minReadySeconds") or 0),
                     "selector": selector, "template": template},
        }
        rs["spec"]["replicas"] = self._new_rs_replicas([*old, rs], rs)
        self._set_new_rs_annotations(rs, new_revision, exists=False)
        self._created = rs
        self.rses.append(rs)
        self.out.create = RSWrite(rs)
        n = rs["spec"]["replicas"]
        if n > 0:
            self.out.events.append(("Normal", "ScalingReplicaSet",
                                    f"Scaled up replica set {name} from 0 to {n}"))
        self._set_deployment_revision(str(new_revision))
        if has_deadline(self.d):
            set_condition(self.status, new_condition("Progressing", "True", NEW_RS_CREATED,
                                                     f'Created new replica set "{name}"', self.now))
        return rs, old

    def _new_rs_replicas(self, all_rses: list[Obj], new: Obj) -> int:
        if not is_rolling(self.d):
            return self.replicas
        current = sum(rs_replicas(rs) for rs in all_rses)
        most = self.replicas + max_surge(self.d)
        if current >= most:
            return rs_replicas(new)
        return rs_replicas(new) + min(most - current, self.replicas - rs_replicas(new))

    # -- scaling ----------------------------------------------------------------------------
    def _scale(self, rs: Obj, size: int, direction: str | None = None) -> bool:
        """Resize `rs` (and refresh its replicas annotations); True if the size changed."""
        old = rs_replicas(rs)
        size_changed = old != size
        ann_changed = self._needs_replicas_annotations(rs)
        if not (size_changed or ann_changed):
            return False
        rs.setdefault("spec", {})["replicas"] = size
        self._set_replicas_annotations(rs)
        event = None
        if size_changed:
            direction = direction or ("up" if size > old else "down")
            event = f"Scaled {direction} replica set {meta(rs).get('name')} from {old} to {size}"
        self._touch(rs, event)
        return size_changed

    def _needs_replicas_annotations(self, rs: Obj) -> bool:
        ann = meta(rs).get("annotations") or {}
        return (ann.get(DESIRED_REPLICAS) != str(self.replicas)
                or ann.get(MAX_REPLICAS) != str(self.replicas + max_surge(self.d)))

    def _scale_and_record(self, rs: Obj, size: int) -> bool:
        if rs_replicas(rs) == size:
            return False
        return self._scale(rs, size)

    def proportional_scale(self, new: Obj | None, old: list[Obj]) -> None:
        """Kubernetes' scale(): resize for a new spec.replicas (or while paused)."""
        active = [rs for rs in [*old, new] if rs is not None and rs_replicas(rs) > 0]
        if len(active) <= 1:
            target = active[0] if active else (new or (max(old, key=created_order) if old else None))
            if target is not None and rs_replicas(target) != self.replicas:
                self._scale_and_record(target, self.replicas)
            return
        if new is not None and self._saturated(new):
            for rs in old:
                if rs_replicas(rs) > 0:
                    self._scale_and_record(rs, 0)
            return
        if not is_rolling(self.d):
            return
        total = sum(rs_replicas(rs) for rs in active)
        allowed = self.replicas + max_surge(self.d) if self.replicas > 0 else 0
        to_add = allowed - total
        if to_add > 0:  # larger first; newer first among equals
            active.sort(key=created_order, reverse=True)
            active.sort(key=lambda rs: -rs_replicas(rs))
            direction = "up"
        elif to_add < 0:  # larger first; older first among equals
            active.sort(key=created_order)
            active.sort(key=lambda rs: -rs_replicas(rs))
            direction = "down"
        else:
            direction = None
        sizes: dict[int, int] = {}
        added = 0
        for i, rs in enumerate(active):
            if to_add != 0:
                share = self._proportion(rs, to_add, added)
                sizes[i] = rs_replicas(rs) + share
                added += share
            else:
                sizes[i] = rs_replicas(rs)
        for i, rs in enumerate(active):
            if i == 0 and to_add != 0:
                sizes[i] = max(0, sizes[i] + to_add - added)
            self._scale(rs, sizes[i], direction)

    def _saturated(self, rs: Obj) -> bool:
        try:
            desired = int((meta(rs).get("annotations") or {}).get(DESIRED_REPLICAS, ""))
        except ValueError:
            return False
        return (rs_replicas(rs) == self.replicas and desired == self.replicas
                and rs_status(rs, "availableReplicas") == self.replicas)

    def _proportion(self, rs: Obj, to_add: int, added: int) -> int:
        if rs_replicas(rs) == 0 or to_add == 0 or to_add == added:
            return 0
        fraction = self._fraction(rs)
        allowed = to_add - added
        return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)

    def _fraction(self, rs: Obj) -> int:
        if self.replicas == 0:
            return -rs_replicas(rs)
        most = self.replicas + max_surge(self.d)
        try:
            before = int((meta(rs).get("annotations") or {}).get(MAX_REPLICAS, ""))
        except ValueError:
            before = 0
        if before == 0:
            before = int(self.status.get("replicas") or 0)
        if before == 0:
            return 0
        exact = rs_replicas(rs) * most / before
        return int(math.floor(exact + 0.5)) - rs_replicas(rs)  # round half away from zero

    def is_scaling_event(self) -> bool:
        new, old = self.sync_revision(create=False)
        for rs in [*old, new]:
            if rs is None or rs_replicas(rs) <= 0:
                continue
            try:
                desired = int((meta(rs).get("annotations") or {}).get(DESIRED_REPLICAS, ""))
            except ValueError:
                continue
            if desired != self.replicas:
                return True
        return False

    # -- strategies -------------------------------------------------------------------------
    def rolling(self) -> None:
        new, old = self.sync_revision(create=True)
        if new is None:  # a name collision: try again with the next hash
            self.sync_status(new, old, rollout=False)
            return
        if self._reconcile_new(new):
            self.sync_status(new, old, rollout=True)
            return
        if self._reconcile_old(new, old):
            self.sync_status(new, old, rollout=True)
            return
        if deployment_complete(self.d, self.d.get("status") or {}):
            self.cleanup(old)
        self.sync_status(new, old, rollout=True)

    def _reconcile_new(self, new: Obj) -> bool:
        have = rs_replicas(new)
        if have == self.replicas:
            return False
        if have > self.replicas:
            return self._scale_and_record(new, self.replicas)
        return self._scale_and_record(new, self._new_rs_replicas(self.rses, new))

    def _reconcile_old(self, new: Obj, old: list[Obj]) -> bool:
        old_count = sum(rs_replicas(rs) for rs in old)
        if old_count == 0:
            return False
        all_count = sum(rs_replicas(rs) for rs in self.rses)
        min_available = self.replicas - max_unavailable(self.d)
        new_unavailable = rs_replicas(new) - rs_status(new, "availableReplicas")
        budget = all_count - min_available - new_unavailable
        if budget <= 0:
            return False
        cleaned = self._cleanup_unhealthy(old, budget)
        scaled = self._scale_down_old(old)
        return cleaned + scaled > 0

    def _cleanup_unhealthy(self, old: list[Obj], budget: int) -> int:
        """Shrink old ReplicaSets by their unavailable pods first: removing those
        costs no availability, and they would otherwise block the rollout."""
        total = 0
        for rs in sorted(old, key=created_order):
            if total >= budget:
                break
            have = rs_replicas(rs)
            available = rs_status(rs, "availableReplicas")
            if have == 0 or have == available:
                continue
            down = min(budget - total, have - available)
            if down <= 0:
                continue
            self._scale_and_record(rs, have - down)
            total += down
        return total

    def _scale_down_old(self, old: list[Obj]) -> int:
        min_available = self.replicas - max_unavailable(self.d)
        available = sum(rs_status(rs, "availableReplicas") for rs in self.rses)
        if available <= min_available:
            return 0
        want = available - min_available
        total = 0
        for rs in sorted(old, key=created_order):
            if total >= want:
                break
            have = rs_replicas(rs)
            if have == 0:
                continue
            down = min(have, want - total)
            self._scale_and_record(rs, have - down)
            total += down
        return total

    def recreate(self) -> None:
        new, old = self.sync_revision(create=False)
        scaled = False
        for rs in old:
            if rs_replicas(rs) > 0:
                scaled = self._scale_and_record(rs, 0) or scaled
        if scaled:
            self.sync_status(new, old, rollout=True)
            return
        if self._old_pods_running(new, old):
            self.sync_status(new, old, rollout=True)
            return
        if new is None:
            new, old = self.sync_revision(create=True)
        if new is not None and rs_replicas(new) != self.replicas:
            self._scale_and_record(new, self.replicas)
        if deployment_complete(self.d, self.d.get("status") or {}):
            self.cleanup(old)
        self.sync_status(new, old, rollout=True)

    def _old_pods_running(self, new: Obj | None, old: list[Obj]) -> bool:
        if sum(rs_status(rs, "replicas") for rs in old) > 0:
            return True
        new_uid = meta(new).get("uid") if new is not None else None
        old_uids = {meta(rs).get("uid") for rs in old}
        for p in self.pods:
            ref = owners.controller_of(p)
            if ref is None or ref.get("uid") == new_uid or ref.get("uid") not in old_uids:
                continue
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                return True
        return False

    def cleanup(self, old: list[Obj]) -> None:
        """Delete old ReplicaSets beyond revisionHistoryLimit (oldest revision first),
        never one that still has pods or whose status is behind its spec."""
        limit = spec_of(self.d).get("revisionHistoryLimit")
        if limit is None:
            return
        alive = [rs for rs in old if not meta(rs).get("deletionTimestamp")]
        extra = len(alive) - int(limit)
        if extra <= 0:
            return
        alive.sort(key=lambda rs: (revision(rs), created_order(rs)))
        for rs in alive[:extra]:
            if rs_status(rs, "replicas") or rs_replicas(rs) or \
                    int(meta(rs).get("generation") or 0) > rs_status(rs, "observedGeneration"):
                continue
            self.out.delete.append(rs)

    # -- status -----------------------------------------------------------------------------
    def calculate_status(self, new: Obj | None) -> Obj:
        rses = self.rses
        available = sum(rs_status(rs, "availableReplicas") for rs in rses)
        total = sum(rs_replicas(rs) for rs in rses)
        st: Obj = {
            "observedGeneration": meta(self.d).get("generation"),
            "replicas": sum(rs_status(rs, "replicas") for rs in rses),
            "updatedReplicas": rs_status(new, "replicas"),
            "readyReplicas": sum(rs_status(rs, "readyReplicas") for rs in rses),
            "availableReplicas": available,
            "unavailableReplicas": max(0, total - available),
        }
        if self.status.get("collisionCount") is not None:
            st["collisionCount"] = self.status["collisionCount"]
        if self.status.get("conditions"):
            st["conditions"] = copy.deepcopy(self.status["conditions"])
        if available >= self.replicas - max_unavailable(self.d):
            set_condition(st, new_condition("Available", "True", MIN_AVAILABLE,
                                            "Deployment has minimum availability.", self.now))
        else:
            set_condition(st, new_condition("Available", "False", MIN_UNAVAILABLE,
                                            "Deployment does not have minimum availability.",
                                            self.now))
        return st

    def sync_status(self, new: Obj | None, old: list[Obj], *, rollout: bool) -> None:
        st = self.calculate_status(new)
        if rollout:
            self._progress(st, new)
        self._finish(st, new)

    def _progress(self, st: Obj, new: Obj | None) -> None:
        """Kubernetes' syncRolloutStatus: Progressing and ReplicaFailure."""
        if not has_deadline(self.d):
            remove_condition(st, "Progressing")
        current = get_condition(self.status, "Progressing")
        complete_before = (int(st.get("replicas") or 0) == int(st.get("updatedReplicas") or 0)
                           and current is not None and current.get("reason") == NEW_RS_AVAILABLE)
        rs_name = meta(new).get("name") if new is not None else None
        if has_deadline(self.d) and not complete_before:
            if deployment_complete(self.d, st):
                msg = (f'ReplicaSet "{rs_name}" has successfully progressed.' if rs_name
                       else f'Deployment "{self.name}" has successfully progressed.')
                set_condition(st, new_condition("Progressing", "True", NEW_RS_AVAILABLE, msg, self.now))
            elif deployment_progressing(self.d, st):
                msg = (f'ReplicaSet "{rs_name}" is progressing.' if rs_name
                       else f'Deployment "{self.name}" is progressing.')
                cond = new_condition("Progressing", "True", RS_UPDATED, msg, self.now)
                have = get_condition(st, "Progressing")
                if have is not None:
                    if have.get("status") == "True":
                        cond["lastTransitionTime"] = have.get("lastTransitionTime")
                    remove_condition(st, "Progressing")
                st["conditions"] = [*(st.get("conditions") or []), cond]
            elif deployment_timed_out(self.d, st, self.now):
                msg = (f'ReplicaSet "{rs_name}" has timed out progressing.' if rs_name
                       else f'Deployment "{self.name}" has timed out progressing.')
                set_condition(st, new_condition("Progressing", "False", TIMED_OUT, msg, self.now))
        failure = self._replica_failure(new)
        if failure is not None:
            set_condition(st, failure)
        else:
            remove_condition(st, "ReplicaFailure")
        self.out.requeue_after = self._deadline_wait(st)

    def _replica_failure(self, new: Obj | None) -> Obj | None:
        order = ([new] if new is not None else []) + [rs for rs in self.rses if rs is not new]
        for rs in order:
            for c in (rs.get("status") or {}).get("conditions") or []:
                if isinstance(c, dict) and c.get("type") == "ReplicaFailure":
                    t = c.get("lastTransitionTime")
                    return {"type": "ReplicaFailure", "status": c.get("status"),
                            "lastUpdateTime": t, "lastTransitionTime": t,
                            "reason": c.get("reason"), "message": c.get("message")}
        return None

    def _deadline_wait(self, st: Obj) -> float | None:
        """When to look again to notice a deadline passing without progress."""
        if not has_deadline(self.d) or spec_of(self.d).get("paused"):
            return self.out.requeue_after
        cond = get_condition(st, "Progressing")
        if cond is None or deployment_complete(self.d, st) or cond.get("reason") in (TIMED_OUT,
                                                                                     NEW_RS_AVAILABLE):
            return self.out.requeue_after
        since = parse_time(cond.get("lastUpdateTime"))
        if since is None:
            return self.out.requeue_after
        wait = since + int(spec_of(self.d)["progressDeadlineSeconds"]) - self.now
        # Whole-second timestamps and a strict "after": one more second makes it certain.
        wait = max(wait, 0.0) + 1.0
        if self.out.requeue_after is not None:
            wait = min(wait, self.out.requeue_after)
        return wait

    def _finish(self, st: Obj, new: Obj | None) -> None:
        clean = _omit_zero(st)
        if clean != _omit_zero(self.d.get("status") or {}):
            self.out.status = clean
        # The new ReplicaSet first: growing before shrinking keeps capacity.
        writes = sorted(self._dirty.items(), key=lambda item: 0 if item[1] is new else 1)
        self.out.update = [RSWrite(rs, self._events.get(name)) for name, rs in writes]

    # -- the pass ---------------------------------------------------------------------------
    def check_paused_condition(self) -> None:
        if not has_deadline(self.d):
            return
        cond = get_condition(self.status, "Progressing")
        if cond is not None and cond.get("reason") == TIMED_OUT:
            return  # a reported lack of progress is not overwritten by pausing
        paused_now = bool(spec_of(self.d).get("paused"))
        has_paused = cond is not None and cond.get("reason") == PAUSED
        if paused_now and not has_paused:
            set_condition(self.status, new_condition("Progressing", "Unknown", PAUSED,
                                                     "Deployment is paused", self.now))
        elif not paused_now and has_paused:
            set_condition(self.status, new_condition("Progressing", "Unknown", RESUMED,
                                                     "Deployment is resumed", self.now))

    def sync_only(self) -> None:
        """Paused, or a scaling event: resize, keep history trimmed while paused."""
        new, old = self.sync_revision(create=False)
        self.proportional_scale(new, old)
        if spec_of(self.d).get("paused"):
            self.cleanup(old)
        self.sync_status(new, old, rollout=False)

    def run(self) -> DeploymentPlan:
        if meta(self.d).get("deletionTimestamp"):
            new, old = self.sync_revision(create=False)
            self.sync_status(new, old, rollout=False)
            return self.out
        self.check_paused_condition()
        if spec_of(self.d).get("paused") or self.is_scaling_event():
            self.sync_only()
        elif is_rolling(self.d):
            self.rolling()
        else:
            self.recreate()
        return self.out


_OMIT_ZERO = ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas",
              "unavailableReplicas")


def _omit_zero(status: Mapping[str, Any]) -> Obj:
    """The status as the Kubernetes API shows it: zero counts left out."""
    return {k: v for k, v in status.items()
            if not (k in _OMIT_ZERO and not v) and v is not None}


def plan(deployment: Mapping[str, Any], replicasets: Iterable[Mapping[str, Any]],
         pods: Iterable[Mapping[str, Any]] = (), *, now: float) -> DeploymentPlan:
    """Decide one pass for `deployment`.

    `replicasets` are all ReplicaSets of its namespace (to claim from and to detect
    name collisions); `pods` the pods of its ReplicaSets, terminating ones
    included (only Recreate looks at them: it waits until the old pods are gone).
    `now` is the wall clock, in seconds: conditions carry wall-clock timestamps.
    """
    return _Planner(deployment, replicasets, pods, now).run()


def failed_create_status(d: Mapping[str, Any], message: str, now: float) -> Obj | None:
    """The status after the new ReplicaSet could not be created (None: no deadline,
    so no Progressing condition to report it in)."""
    if not has_deadline(d):
        return None
    st = copy.deepcopy(dict(d.get("status") or {}))
    set_condition(st, new_condition("Progressing", "False", RS_CREATE_ERROR, message, now))
    return _omit_zero(st)
