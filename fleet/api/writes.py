"""Kubernetes' metadata rules of a write, as pure functions (no I/O).

What every stored write does to `metadata`, whatever the backend: a create
gets its uid, creationTimestamp, generation 1 and resourceVersion and is never
born deleting; an update keeps uid and creationTimestamp, never resurrects an
object marked for deletion, bumps `generation` when anything but metadata and
status changed (or when deletion starts), and completes a deletion when it
removes the last finalizer of an object marked with a grace period of 0; a
delete of an object with finalizers only marks it (deletionTimestamp,
deletionGracePeriodSeconds 0), once.  The SQLite backend calls these inside
its write transaction; an etcd backend calls the same ones, so the two can
never disagree.  Each takes the new revision and the time as arguments.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


def metadata_of(obj: dict[str, Any]) -> dict[str, Any]:
    """obj["metadata"], made a dict if it is missing or not one."""
    md = obj.get("metadata")
    if not isinstance(md, dict):
        md = {}
        obj["metadata"] = md
    return md


def spec_view(obj: dict[str, Any]) -> dict[str, Any]:
    """What `generation` tracks: everything except metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def is_uuid(value: Any) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _generation(md: dict[str, Any]) -> int:
    g = md.get("generation")
    return g if isinstance(g, int) and not isinstance(g, bool) else 1


def prepare_create(new: dict[str, Any], revision: int, now: str) -> dict[str, Any]:
    """Metadata of an object being created (mutates and returns `new`).

    A caller may assign the uid up front (the API server does, so that
    defaulting can derive from it, e.g. a Job's controller-uid selector);
    anything that is not a canonical UUID is replaced."""
    md = metadata_of(new)
    md.pop("deletionTimestamp", None)
    md.pop("deletionGracePeriodSeconds", None)
    if not is_uuid(md.get("uid")):
        md["uid"] = str(uuid.uuid4())
    md["creationTimestamp"] = now
    md["generation"] = 1
    md["resourceVersion"] = str(revision)
    return new


def prepare_update(new: dict[str, Any], old: dict[str, Any], revision: int) -> bool:
    """Metadata of `new` replacing `old` (mutates `new`); True when this update
    completes a deletion (the object goes, as a DELETED event)."""
    md = metadata_of(new)
    omd = old.get("metadata") if isinstance(old.get("metadata"), dict) else {}
    for name in ("uid", "creationTimestamp"):
        if name in omd:
            md[name] = omd[name]
        else:
            md.pop(name, None)
    was_deleting = bool(omd.get("deletionTimestamp"))
    if was_deleting:
        # Deletion is one-way: an update can never resurrect the object.
        md["deletionTimestamp"] = omd["deletionTimestamp"]
        if "deletionGracePeriodSeconds" in omd:
            md["deletionGracePeriodSeconds"] = omd["deletionGracePeriodSeconds"]
    generation = _generation(omd)
    if spec_view(new) != spec_view(old) or (md.get("deletionTimestamp") and not was_deleting):
        generation += 1
    md["generation"] = generation
    md["resourceVersion"] = str(revision)
    # Only the update that removes the *last* finalizer completes a deletion; an
    # object marked for deletion without finalizers (a Terminating namespace, a
    # pod in its grace period) stays until it is deleted.  A pod still in its
    # grace period stays even then: its node has not confirmed the containers
    # stopped (Kubernetes requires deletionGracePeriodSeconds 0).
    return (bool(md.get("deletionTimestamp")) and not md.get("finalizers")
            and bool(omd.get("finalizers")) and not md.get("deletionGracePeriodSeconds"))


@dataclass(frozen=True)
class DeleteStep:
    """What a delete of a stored object does: nothing (already marked), mark it
    (finalizers remain), or remove it."""

    write: bool  # False: nothing to write, nothing to tell watchers
    removed: bool


def prepare_delete(new: dict[str, Any], revision: int, now: str) -> DeleteStep:
    """Metadata of a copy `new` of the stored object being deleted (mutates `new`)."""
    md = metadata_of(new)
    if md.get("finalizers"):
        if md.get("deletionTimestamp") and md.get("deletionGracePeriodSeconds") == 0:
            return DeleteStep(write=False, removed=False)
        if not md.get("deletionTimestamp"):
            md["deletionTimestamp"] = now
            md["generation"] = _generation(md) + 1
        md["deletionGracePeriodSeconds"] = 0
        md["resourceVersion"] = str(revision)
        return DeleteStep(write=True, removed=False)
    md["resourceVersion"] = str(revision)
    return DeleteStep(write=True, removed=True)


__all__ = ["DeleteStep", "is_uuid", "metadata_of", "prepare_create", "prepare_delete", "prepare_update",
           "spec_view"]
