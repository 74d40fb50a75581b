"""How a DELETE turns into store writes: propagation policy, GC finalizers, grace.

Kubernetes splits cascading deletion between the API server and the garbage
collector (fleet/controllers/garbagecollector.py).  The API server's half lives
here, so every DELETE path (one object, deletecollection — the namespace
controller's Background sweep of a Terminating namespace — and eviction)
shares one definition:

* **Background** (the default for almost every kind): the owner goes now; the
  collector later deletes the dependents whose owners are all gone.
* **Foreground**: the owner gets `deletionTimestamp` and the `foregroundDeletion`
  finalizer and stays readable while the collector deletes its dependents; the
  collector removes the finalizer once no dependent with `blockOwnerDeletion`
  is left, and the store completes the deletion then.
* **Orphan**: the owner gets the `orphan` finalizer; the collector strips the
  ownerReferences to it from its dependents, then removes the finalizer.

Which finalizers an object ends up with follows kube-apiserver's
`deletionFinalizersForGarbageCollection`: an explicit `orphanDependents` wins,
then `propagationPolicy`, then a GC finalizer the object already carries, then
the kind's default.  The defaults are kept for compatibility exactly as
Kubernetes keeps them: a `v1` ReplicationController and a `batch/v1` Job orphan
their pods when the request names no policy (kubectl always names one:
`--cascade=background` is its default), and Events take no part in garbage
collection at all.  Because an object that is already being deleted still has
its GC finalizers rewritten by a new DELETE, `kubectl delete --cascade=orphan`
can turn a stuck foreground deletion into an orphaning one, as in Kubernetes.

Pods on a node are the one graceful kind: their first DELETE only marks them
(the agent stops the containers, then deletes for good with grace 0), and a
repeated DELETE of a pod still in its grace period changes nothing — not even
the finalizers, again as kube-apiserver does.

`plan_delete` is the pure decision; `delete_stored` runs it against the store
with optimistic concurrency.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet.api import meta
from fleet.api.registry import KindInfo
from fleet.store import RevisionConflict, Store

FOREGROUND_FINALIZER = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"
GC_FINALIZERS = (ORPHAN_FINALIZER, FOREGROUND_FINALIZER)

BACKGROUND = "Background"
FOREGROUND = "Foreground"
ORPHAN = "Orphan"
POLICIES = (BACKGROUND, FOREGROUND, ORPHAN)

# (group, version, kind) whose DELETE without options orphans the dependents:
# the behaviour they had before server-side garbage collection existed.
ORPHAN_BY_DEFAULT = frozenset({("", "v1", "ReplicationController"), ("batch", "v1", "Job")})
# (group, kind) outside garbage collection: never given GC finalizers.
NOT_COLLECTED = frozenset({("", "Event"), ("events.k8s.io", "Event")})

# The warning kube-apiserver adds when a batch/v1 Job is deleted with no policy.
JOB_ORPHAN_WARNING = ("child pods are preserved by default when jobs are deleted; set "
                      "propagationPolicy=Background to remove them or set propagationPolicy=Orphan "
                      "to suppress this warning")

MAX_ATTEMPTS = 8

Mark = Callable[[dict[str, Any]], None]


class PreconditionFailed(Exception):
    """The DeleteOptions' uid or resourceVersion precondition does not hold."""


class TooManyConflicts(Exception):
    """Concurrent writers kept changing the object; the caller answers 409."""


def default_policy(info: KindInfo) -> str | None:
    """The kind's policy for a DELETE that names none; None: no garbage collection."""
    if (info.group, info.kind) in NOT_COLLECTED:
        return None
    if (info.group, info.version, info.kind) in ORPHAN_BY_DEFAULT:
        return ORPHAN
    return BACKGROUND


def warnings_for(info: KindInfo, opts: dict[str, Any]) -> list[str]:
    """Warnings kube-apiserver attaches to a DELETE (the Job orphaning one)."""
    if (info.group, info.version, info.kind) == ("batch", "v1", "Job") and \
            opts.get("propagationPolicy") is None and opts.get("orphanDependents") is None:
        return [JOB_ORPHAN_WARNING]
    return []


def should_orphan(default: str | None, opts: dict[str, Any], finalizers: list[str]) -> bool:
    if default is None:
        return False
    if opts.get("orphanDependents") is not None:
        return bool(opts["orphanDependents"])
    policy = opts.get("propagationPolicy")
    if policy is not None:
        return policy == ORPHAN
    # A GC finalizer already on the object is a policy chosen earlier.
    for f in finalizers:
        if f == ORPHAN_FINALIZER:
            return True
        if f == FOREGROUND_FINALIZER:
            return False
    return default == ORPHAN


def should_foreground(default: str | None, opts: dict[str, Any], finalizers: list[str]) -> bool:
    if default is None:
        return False
    if opts.get("orphanDependents") is not None:
        return False
    policy = opts.get("propagationPolicy")
    if policy is not None:
        return policy == FOREGROUND
    for f in finalizers:
        if f == FOREGROUND_FINALIZER:
            return True
        if f == ORPHAN_FINALIZER:
            return False
    return False


def gc_finalizers(info: KindInfo, finalizers: list[str], opts: dict[str, Any]) -> list[str]:
    """The object's finalizers after this DELETE: the GC ones rewritten per `opts`.

    Returns `finalizers` itself when nothing changes (compared as sets, as
    Kubernetes does, so the order of an unchanged list is kept)."""
    default = default_policy(info)
    if default is None:
        return finalizers
    out = [f for f in finalizers if f not in GC_FINALIZERS]
    if should_orphan(default, opts, finalizers):
        out.append(ORPHAN_FINALIZER)
    if should_foreground(default, opts, finalizers):
        out.append(FOREGROUND_FINALIZER)
    return finalizers if set(out) == set(finalizers) else out


_stamp = meta.format_time


@dataclass
class Step:
    """What one DELETE writes, in order.

    `update`: an object to store first (based on the object the plan was made
    from); `update_removes`: that update removes the last finalizer of an object
    marked for deletion, so the store deletes it; `then_delete`: call the store's
    delete afterwards (it removes an object without finalizers, or marks one
    that has some)."""

    update: dict[str, Any] | None = None
    update_removes: bool = False
    then_delete: bool = False


def plan_delete(info: KindInfo, old: dict[str, Any], opts: dict[str, Any], *,
                now: datetime.datetime, mark: Mark | None = None) -> Step:
    """The pure decision of a DELETE of `old` with DeleteOptions `opts`.

    `mark(obj)` (eviction's DisruptionTarget condition) is applied in the write
    that starts the deletion; an object already being deleted is not marked."""
    md = old.get("metadata") or {}
    deleting = bool(md.get("deletionTimestamp"))
    raw_fins = md.get("finalizers")
    # A stored object may predate typed validation: only a list of strings counts.
    old_fins = [f for f in raw_fins if isinstance(f, str)] if isinstance(raw_fins, list) else []
    # The kind's graceful-deletion strategy (rest.RESTGracefulDeleteStrategy; Pods'
    # CheckGracefulDelete): a period > 0 marks the object and leaves it to its node.
    grace = info.delete_grace(old, opts.get("gracePeriodSeconds")) if info.delete_grace else 0
    if grace > 0:
        if deleting:
            # Graceful deletion is pending: the agent is on it.  Only a
            # period of 0 (the non-graceful path below) shortens it.
            return Step()
        new = copy.deepcopy(old)
        nmd = new["metadata"]
        nmd["deletionTimestamp"] = _stamp(now + datetime.timedelta(seconds=grace))
        nmd["deletionGracePeriodSeconds"] = grace
        _set_finalizers(nmd, gc_finalizers(info, old_fins, opts))
        if mark is not None:
            mark(new)
        return Step(update=new)
    fins = gc_finalizers(info, old_fins, opts)
    changed = fins is not old_fins
    marking = mark is not None and not deleting
    if fins:
        # Finalizers remain: the object is only marked for deletion.
        if not deleting:
            new = copy.deepcopy(old)
            nmd = new["metadata"]
            _set_finalizers(nmd, fins)
            nmd["deletionTimestamp"] = _stamp(now)
            nmd["deletionGracePeriodSeconds"] = 0
            if marking and mark is not None:
                mark(new)
            return Step(update=new)
        update = None
        if changed:
            update = copy.deepcopy(old)
            _set_finalizers(update["metadata"], fins)
        # The store's delete brings a pending grace period down to 0.
        return Step(update=update, then_delete=md.get("deletionGracePeriodSeconds") != 0)
    if old_fins:
        # Only GC finalizers were left and this DELETE drops them: removing the
        # last finalizer of an object marked for deletion deletes it.
        new = copy.deepcopy(old)
        nmd = new["metadata"]
        _set_finalizers(nmd, [])
        if not deleting:
            nmd["deletionTimestamp"] = _stamp(now)
            nmd["deletionGracePeriodSeconds"] = 0
            if marking and mark is not None:
                mark(new)
        return Step(update=new, update_removes=True)
    if marking and mark is not None:
        new = copy.deepcopy(old)
        mark(new)
        return Step(update=new, then_delete=True)
    return Step(then_delete=True)


def _set_finalizers(md: dict[str, Any], fins: list[str]) -> None:
    if fins:
        md["finalizers"] = list(fins)
    else:
        md.pop("finalizers", None)


def preview(step: Step, old: dict[str, Any], *, now: datetime.datetime) -> tuple[dict[str, Any], bool]:
    """What a dry run answers: the object as the plan would leave it, and whether it would be gone."""
    if step.update_removes:
        return step.update or old, True
    obj = step.update or old
    if not step.then_delete:
        return obj, False
    md = obj.get("metadata") or {}
    if md.get("finalizers"):
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("deletionTimestamp", _stamp(now))
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        return obj, False
    return obj, True


async def delete_stored(store: Store, info: KindInfo, key: str, opts: dict[str, Any], *,
                        current: dict[str, Any] | None = None, dry_run: bool = False,
                        mark: Mark | None = None) -> tuple[dict[str, Any], bool]:
    """DELETE the object at `key` per DeleteOptions `opts`; returns (object, removed).

    `current` is the object as the caller already read it (saves a read).  The
    preconditions (uid, resourceVersion) are checked against what is read; a
    write that loses to a concurrent writer is re-planned on the fresh object
    unless the client pinned a resourceVersion.  Raises KeyNotFound,
    PreconditionFailed or TooManyConflicts."""
    pre = opts.get("preconditions") or {}
    expected_uid = pre.get("uid") or None
    expected_rv = pre.get("resourceVersion")
    expected_rv = int(expected_rv) if expected_rv not in (None, "") else None
    for attempt in range(MAX_ATTEMPTS):
        old = current if attempt == 0 and current is not None else await store.get(key)
        md = old["metadata"]
        if expected_uid and md.get("uid") != expected_uid:
            raise PreconditionFailed("the UID precondition did not match")
        rv = int(md["resourceVersion"])
        if expected_rv is not None and rv != expected_rv:
            raise PreconditionFailed("the resourceVersion precondition did not match")
        now = meta.utcnow()
        step = plan_delete(info, old, opts, now=now, mark=mark)
        if dry_run:
            return preview(step, old, now=now)
        try:
            if step.update is not None:
                stored = await store.update(key, step.update, expected_revision=rv)
                if step.update_removes:
                    return stored, True
                if not step.then_delete:
                    return stored, False
                rv = int(stored["metadata"]["resourceVersion"])
            elif not step.then_delete:
                return old, False
            # Without a prior write of ours and without a client precondition the
            # store's delete needs no revision: it decides on the stored object
            # (finalizers mark, no finalizers remove) by itself.
            pinned = rv if step.update is not None or expected_rv is not None else None
            return await store.delete(key, expected_revision=pinned, expected_uid=expected_uid)
        except RevisionConflict:
            if expected_rv is not None:
                raise PreconditionFailed("the resourceVersion precondition did not match") from None
            continue
    raise TooManyConflicts(key)


__all__ = [
    "BACKGROUND", "FOREGROUND", "FOREGROUND_FINALIZER", "ORPHAN", "ORPHAN_FINALIZER", "POLICIES",
    "PreconditionFailed", "Step", "TooManyConflicts", "default_policy", "delete_stored",
    "gc_finalizers", "plan_delete", "warnings_for",
]
