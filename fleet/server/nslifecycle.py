"""Namespace lifecycle: finalize namespaces that are being deleted.

Deleting a namespace marks it Terminating (deletionTimestamp, status.phase)
and refuses new content in it (rest.py); this task then does what
kube-controller-manager's namespace controller does:

1. delete every namespaced object in it with the Background policy, through
   the same deletion rules as a DELETE request (deletion.py) — so pods on a
   node terminate gracefully (the agent stops them, then removes them), objects
   with finalizers are only marked, and a foreground or orphaning deletion
   still pending on an item is overridden, as the namespace controller's
   Background delete-collection overrides it;
2. report progress in the namespace's status conditions, with Kubernetes'
   types, reasons and messages: `NamespaceDeletionContentFailure` (a delete
   failed), `NamespaceContentRemaining` ("pods. has 2 resource instances"),
   `NamespaceFinalizersRemaining` ("example.com/x in 1 resource instances"),
   plus the two discovery conditions, which are always in their "ok" form
   here because the kinds come from the in-process registry.  A condition
   keeps its lastTransitionTime until its status flips;
3. remove the namespace once nothing is left and `spec.finalizers` holds
   nothing but our own `kubernetes` token (another token belongs to some
   other controller, which finalizes it through the API).  If the namespace
   itself carries metadata finalizers (say `foregroundDeletion` from a
   `kubectl delete ns --cascade=foreground`), our token is cleared from
   `spec.finalizers` instead — the garbage collector waits for exactly that
   before it drops its finalizer, which then removes the namespace.

A namespace that vanished before it was empty (someone stripped its
finalizers by hand) still has its leftovers deleted.

It re-checks pending namespaces every RETRY_INTERVAL (a pod in its grace
period, an object waiting for its finalizers) and, at start-up, resumes any
namespace left Terminating by a crash.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import meta
from fleet.api.registry import Registry
from fleet.server import deletion
from fleet.store import KeyNotFound, RevisionConflict, Store

log = logging.getLogger(__name__)
RETRY_INTERVAL = 1.0
FINALIZER_TOKEN = "kubernetes"  # spec.finalizers entry this controller owns

DISCOVERY_FAILURE = "NamespaceDeletionDiscoveryFailure"
GV_PARSING_FAILURE = "NamespaceDeletionGroupVersionParsingFailure"
CONTENT_FAILURE = "NamespaceDeletionContentFailure"
CONTENT_REMAINING = "NamespaceContentRemaining"
FINALIZERS_REMAINING = "NamespaceFinalizersRemaining"
CONDITION_TYPES = (DISCOVERY_FAILURE, GV_PARSING_FAILURE, CONTENT_FAILURE, CONTENT_REMAINING,
                   FINALIZERS_REMAINING)
# The "nothing wrong" variant of each condition (status False), as Kubernetes words it.
OK_CONDITIONS = {
    DISCOVERY_FAILURE: ("ResourcesDiscovered", "All resources successfully discovered"),
    GV_PARSING_FAILURE: ("ParsedGroupVersions", "All legacy kube types successfully parsed"),
    CONTENT_FAILURE: ("ContentDeleted", "All content successfully deleted, may be waiting on finalization"),
    CONTENT_REMAINING: ("ContentRemoved", "All content successfully removed"),
    FINALIZERS_REMAINING: ("ContentHasNoFinalizers", "All content-preserving finalizers finished"),
}


@dataclass
class ContentTotals:
    """What one pass left behind: per resource ("pods." / "jobs.batch") and per finalizer."""

    remaining: Counter[str] = field(default_factory=Counter)
    finalizers: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.remaining and not self.errors


def failure_conditions(totals: ContentTotals) -> dict[str, tuple[str, str]]:
    """The conditions that are True after a pass: type -> (reason, message)."""
    out: dict[str, tuple[str, str]] = {}
    if totals.errors:
        msgs = sorted(totals.errors)
        out[CONTENT_FAILURE] = ("ContentDeletionFailed", f"Failed to delete all resource types, {len(msgs)} "
                                f"remaining: {', '.join(msgs)}")
    if totals.remaining:
        parts = sorted(f"{r} has {n} resource instances" for r, n in totals.remaining.items() if n)
        out[CONTENT_REMAINING] = ("SomeResourcesRemain", "Some resources are remaining: " + ", ".join(parts))
    if totals.finalizers:
        parts = sorted(f"{f} in {n} resource instances" for f, n in totals.finalizers.items() if n)
        out[FINALIZERS_REMAINING] = ("SomeFinalizersRemain",
                                     "Some content in the namespace has finalizers remaining: " + ", ".join(parts))
    return out


def updated_conditions(conditions: list[dict[str, Any]], failures: dict[str, tuple[str, str]],
                       now: str) -> list[dict[str, Any]] | None:
    """The namespace's conditions with ours brought up to date; None when nothing changed.

    Conditions of other types are kept; the first of each of our types is
    updated in place, its lastTransitionTime moving only when its status flips."""
    out = [dict(c) for c in conditions if isinstance(c, dict)]
    changed = False
    for ctype in CONDITION_TYPES:
        status = "True" if ctype in failures else "False"
        reason, message = failures.get(ctype) or OK_CONDITIONS[ctype]
        cur = next((c for c in out if c.get("type") == ctype), None)
        if cur is None:
            out.append({"type": ctype, "status": status, "lastTransitionTime": now, "reason": reason,
                        "message": message})
            changed = True
        elif (cur.get("status"), cur.get("reason"), cur.get("message")) != (status, reason, message):
            if cur.get("status") != status:
                cur["lastTransitionTime"] = now
            cur.update(status=status, reason=reason, message=message)
            changed = True
    return out if changed else None


async def delete_content(store: Store, registry: Registry, namespace: str) -> ContentTotals:
    """Delete every object in `namespace` (Background) and total up what is left."""
    totals = ContentTotals()
    seen_prefixes: set[str] = set()
    opts = {"propagationPolicy": deletion.BACKGROUND}
    for info in registry.all():
        if not info.namespaced or "delete" not in info.verbs:
            continue
        prefix = info.key(namespace)
        if prefix in seen_prefixes:
            continue
        seen_prefixes.add(prefix)
        resource = f"{info.plural}.{info.group}"
        try:
            res = await store.list(prefix)
        except Exception as e:  # noqa: BLE001 - report it in the condition, retry next pass
            totals.errors.append(f"failed to list {resource}: {e}")
            continue
        for obj in res.items:
            md = obj["metadata"]
            try:
                left, removed = await deletion.delete_stored(store, info, info.key(namespace, md["name"]), opts,
                                                             current=obj)
            except KeyNotFound:
                continue
            except (deletion.PreconditionFailed, deletion.TooManyConflicts, RevisionConflict) as e:
                totals.errors.append(f"deleting {resource} {md['name']}: {e}")
                totals.remaining[resource] += 1
                continue
            if removed:
                continue
            totals.remaining[resource] += 1
            for f in (left.get("metadata") or {}).get("finalizers") or []:
                totals.finalizers[f] += 1
    return totals


async def _write_conditions(store: Store, key: str, ns: dict[str, Any], totals: ContentTotals) -> None:
    status = ns.get("status") or {}
    new_conditions = updated_conditions(status.get("conditions") or [], failure_conditions(totals),
                                        meta.now_rfc3339())
    if new_conditions is None:
        return
    new = copy.deepcopy(ns)
    new.setdefault("status", {})["conditions"] = new_conditions
    new["status"]["phase"] = "Terminating"
    try:
        await store.update(key, new, expected_revision=int(ns["metadata"]["resourceVersion"]))
    except (RevisionConflict, KeyNotFound):
        pass  # someone else wrote it (or it is gone); the next pass writes again if still needed


async def finalize(store: Store, registry: Registry, namespace: str) -> bool:
    """One pass; True when nothing is left for this task to do (the namespace is
    gone and empty, is not being deleted, or waits only on finalizers that other
    owners remove)."""
    key = meta.store_key("", "namespaces", None, namespace)
    try:
        ns: dict[str, Any] | None = await store.get(key)
    except KeyNotFound:
        ns = None
    if ns is not None and not ns["metadata"].get("deletionTimestamp"):
        return True
    totals = await delete_content(store, registry, namespace)
    if ns is None:
        # Removed before it was empty (someone stripped its finalizers): no new
        # content can be created in a missing namespace, so clear what is left.
        return totals.empty
    await _write_conditions(store, key, ns, totals)
    if not totals.empty:
        return False
    try:
        ns = await store.get(key)
    except KeyNotFound:
        return True
    md = ns["metadata"]
    spec_finalizers = list((ns.get("spec") or {}).get("finalizers") or [])
    if any(f != FINALIZER_TOKEN for f in spec_finalizers):
        return False  # another controller's token: it finalizes the namespace itself
    try:
        if md.get("finalizers") and spec_finalizers:
            # Metadata finalizers remain (the garbage collector's foregroundDeletion or
            # orphan, or someone else's): clearing our token tells their owners the
            # content is gone; the last of them to go removes the namespace.
            new = copy.deepcopy(ns)
            new["spec"]["finalizers"] = []
            ns = await store.update(key, new, expected_revision=int(md["resourceVersion"]))
        await store.delete(key, expected_uid=md.get("uid"))
    except RevisionConflict:
        return False  # changed under us: look again next pass
    except KeyNotFound:
        pass
    return True


async def run(store: Store, registry: Registry, requests: trio.MemoryReceiveChannel,
              *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    pending: set[str] = set()
    res = await store.list(meta.store_key("", "namespaces", None))
    for ns in res.items:
        md = ns.get("metadata") if isinstance(ns, dict) else None
        # A namespace stored without a usable metadata (a write from before
        # validation) is skipped, not a reason to stop finalizing the others.
        if isinstance(md, dict) and md.get("deletionTimestamp") and isinstance(md.get("name"), str):
            pending.add(md["name"])
    task_status.started()
    while True:
        with trio.move_on_after(RETRY_INTERVAL if pending else float("inf")):
            name = await requests.receive()
            pending.add(name)
        for name in sorted(pending):
            try:
                done = await finalize(store, registry, name)
            except Exception:  # keep finalizing other namespaces; retry this one later
                log.exception("finalizing namespace %s", name)
                done = False
            if done:
                pending.discard(name)
