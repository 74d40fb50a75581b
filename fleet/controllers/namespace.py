"""Namespace controller: empty a namespace being deleted, then hand it back.

kube-controller-manager's namespace controller (pkg/controller/namespace), an
API client like every controller of the manager.  Deleting a namespace marks it
Terminating (deletionTimestamp, status.phase; the server refuses new content
in it, rest_write.py); for such a namespace this controller:

1. discovers every namespaced resource that supports list and deletecollection
   and issues, for each, a deletecollection in the namespace with the
   Background policy — the API's ordinary DELETE rules apply to every item
   (fleet/server/deletion.py): pods on a node terminate gracefully (the agent
   stops them, then removes them), objects with finalizers are only marked,
   and a foreground or orphaning deletion still pending on an item is
   overridden, as an explicit Background policy overrides it in Kubernetes;
2. lists what is left of each resource it had to delete something from, and
   reports progress in the namespace's status conditions with Kubernetes'
   types, reasons and messages: `NamespaceDeletionDiscoveryFailure`,
   `NamespaceDeletionGroupVersionParsingFailure` (always its "ok" form: our
   discovery hands out parsed group/versions), `NamespaceDeletionContentFailure`
   (a deletecollection failed), `NamespaceContentRemaining` ("pods. has 2
   resource instances") and `NamespaceFinalizersRemaining` ("example.com/x in
   1 resource instances").  A condition keeps its lastTransitionTime until its
   status flips; nothing is written when nothing changed;
3. once nothing is left, removes its own `kubernetes` token from
   `spec.finalizers` through the `namespaces/{name}/finalize` subresource (PUT).
   The server removes a namespace whose finalize leaves it with neither spec
   nor metadata finalizers; another controller's token is that controller's to
   remove; with metadata finalizers on the namespace (`foregroundDeletion` from
   `kubectl delete ns --cascade=foreground`) the garbage collector waits for
   exactly this token to go before it drops its own, which removes the
   namespace.

While content remains (a pod in its grace period, an object waiting for its
finalizers) the namespace is looked at again every `retry_interval`.  The
namespace informer's initial list resumes any namespace left Terminating by a
restart.  A namespace that vanished before it was empty (its finalizers
stripped by hand) still has its leftovers deleted: no new content can be
created in a missing namespace.

The decisions are pure functions (`needs_sync`, `deletable`, `plan` and the
condition helpers), table-tested; `NamespaceController` is the thin loop over
the shared namespace informer and the work queue that does the I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet.api import meta
from fleet.client import ApiException, APIResource
from fleet.client.discovery import resource_path
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, split_key

RETRY_INTERVAL = 1.0
CONFLICT_RETRY = 0.05
FINALIZER_TOKEN = "kubernetes"  # spec.finalizers entry this controller owns
BACKGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}

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
    """What one pass left behind: per resource ("pods." / "jobs.batch") and per
    finalizer, the deletes that failed, and a discovery failure."""

    remaining: Counter[str] = field(default_factory=Counter)
    finalizers: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    discovery_error: str = ""

    @property
    def empty(self) -> bool:
        """Nothing is known to be left (a failed discovery knows nothing: not empty)."""
        return not self.remaining and not self.errors and not self.discovery_error


def failure_conditions(totals: ContentTotals) -> dict[str, tuple[str, str]]:
    """The conditions that are True after a pass: type -> (reason, message)."""
    out: dict[str, tuple[str, str]] = {}
    if totals.discovery_error:
        out[DISCOVERY_FAILURE] = ("DiscoveryFailed",
                                  f"Discovery failed for some groups, 1 failing: {totals.discovery_error}")
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


def _spec_finalizers(ns: dict[str, Any]) -> list[str]:
    spec = ns.get("spec") if isinstance(ns.get("spec"), dict) else {}
    fins = spec.get("finalizers")
    return [f for f in fins if isinstance(f, str)] if isinstance(fins, list) else []


def needs_sync(ns: dict[str, Any] | None) -> bool:
    """Whether a content pass is due: the namespace vanished (its leftovers go), or
    it is being deleted and not yet finalized.  A namespace whose spec finalizers
    are all gone but which still has metadata finalizers waits only for their
    owners (the garbage collector's `foregroundDeletion`)."""
    if ns is None:
        return True
    md = ns.get("metadata") or {}
    if not md.get("deletionTimestamp"):
        return False
    return bool(_spec_finalizers(ns)) or not md.get("finalizers")


def deletable(resources: list[APIResource]) -> list[APIResource]:
    """What a namespace is emptied of: every namespaced resource, at its group's
    preferred version, that supports both list and deletecollection."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in resources:
        if not (r.namespaced and r.preferred and r.has_verb("list") and r.has_verb("deletecollection")):
            continue
        if (r.group, r.name) in seen:
            continue
        seen.add((r.group, r.name))
        out.append(r)
    return out


def resource_name(r: APIResource) -> str:
    """"pods." / "jobs.batch": how Kubernetes' conditions name a resource."""
    return f"{r.name}.{r.group}"


def count_remaining(totals: ContentTotals, resource: str, items: list[dict[str, Any]]) -> None:
    """Add what a list of `resource` still holds to `totals` (items and their finalizers)."""
    for item in items:
        totals.remaining[resource] += 1
        md = item.get("metadata") if isinstance(item, dict) else None
        fins = md.get("finalizers") if isinstance(md, dict) else None
        for f in fins if isinstance(fins, list) else []:
            if isinstance(f, str):
                totals.finalizers[f] += 1


@dataclass(frozen=True)
class Plan:
    """What to write after a content pass.

    `conditions`: the namespace's new status.conditions (None: unchanged);
    `finalizers`: the spec.finalizers to PUT through `finalize` (None: not yet);
    `retry`: look again after this many seconds (None: wait for an event)."""

    conditions: list[dict[str, Any]] | None = None
    finalizers: list[str] | None = None
    retry: float | None = None


def plan(ns: dict[str, Any] | None, totals: ContentTotals, now: str, *,
         retry_interval: float = RETRY_INTERVAL) -> Plan:
    """The pure decision after a pass over `ns`'s content left `totals`."""
    if ns is None:
        return Plan(retry=None if totals.empty else retry_interval)
    status = ns.get("status") if isinstance(ns.get("status"), dict) else {}
    raw = status.get("conditions")
    conditions = updated_conditions(raw if isinstance(raw, list) else [], failure_conditions(totals), now)
    if not totals.empty:
        return Plan(conditions=conditions, retry=retry_interval)
    fins = _spec_finalizers(ns)
    md = ns.get("metadata") or {}
    if FINALIZER_TOKEN in fins or (not fins and not md.get("finalizers")):
        # Our token goes (another's stays for its owner); an already empty list
        # is sent too, so that the server removes a namespace nothing holds.
        return Plan(conditions=conditions, finalizers=[f for f in fins if f != FINALIZER_TOKEN])
    return Plan(conditions=conditions)


class NamespaceController(QueueWorker):
    """The loop: namespace events → queue → reconcile (pass, plan, writes)."""

    name = "namespace"
    kind = "Namespace"
    workers = 2

    def __init__(self, *, retry_interval: float = RETRY_INTERVAL,
                 now: Callable[[], str] = meta.now_rfc3339) -> None:
        super().__init__()
        self.retry_interval = retry_interval
        self.now = now

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.namespaces: SharedInformer = ctx.informers.informer("v1", "namespaces")
        self.namespaces.add_handler(self.on_namespace)

    def on_namespace(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            self.enqueue(old)  # gone: make sure nothing was left behind in it
        elif new is not None and (new.get("metadata") or {}).get("deletionTimestamp"):
            self.enqueue(new)

    async def delete_content(self, namespace: str) -> ContentTotals:
        """Background deletecollection of every deletable resource in `namespace`,
        then a list of those that had something, to total up what is left."""
        client = self.ctx.client
        totals = ContentTotals()
        try:
            # Cached per client: the served resources are the built-in kinds.
            resources = await client.discover()
        except ApiException as e:
            totals.discovery_error = str(e)
            return totals
        for res in deletable(resources):
            name = resource_name(res)
            path = resource_path(res.api_version, res.name, namespace)
            failed = False
            try:
                resp = await client.request("DELETE", path, json=BACKGROUND)
                deleted = (resp.json() or {}).get("items") or []
            except ApiException as e:
                if e.code == 404:
                    continue  # no longer served
                totals.errors.append(f"failed to delete {name}: {e}")
                deleted, failed = [], True
            if not deleted and not failed:
                continue  # nothing was there, so nothing can be left
            try:
                left = await client.list_all(res.api_version, res.name, namespace)
            except ApiException as e:
                totals.errors.append(f"failed to list {name}: {e}")
                continue
            count_remaining(totals, name, left.get("items") or [])
        return totals

    async def reconcile(self, key: str) -> float | None:
        _, name = split_key(key)
        client = self.ctx.client
        try:
            # The latest state, not the cache: several controllers edit a
            # terminating namespace (the garbage collector's finalizers).
            ns: dict[str, Any] | None = await client.get_object("v1", "namespaces", name)
        except ApiException as e:
            if e.code != 404:
                raise
            ns = None
        if not needs_sync(ns):
            return None
        totals = await self.delete_content(name)
        p = plan(ns, totals, self.now(), retry_interval=self.retry_interval)
        if ns is None:
            return p.retry
        try:
            if p.conditions is not None:
                new = dict(ns, status={**(ns.get("status") or {}), "conditions": p.conditions,
                                       "phase": "Terminating"})
                ns = await client.replace("v1", "namespaces", name, new, subresource="status")
            if p.finalizers is not None:
                assert ns is not None
                body = dict(ns, spec={**(ns.get("spec") or {}), "finalizers": p.finalizers})
                await client.replace("v1", "namespaces", name, body, subresource="finalize")
        except ApiException as e:
            if e.code == 404:
                return None  # gone meanwhile: its DELETED event brings it back if anything is left
            if e.code == 409:
                return CONFLICT_RETRY  # written meanwhile: decide again on the fresh namespace
            raise
        return p.retry
