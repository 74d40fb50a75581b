"""The garbage collector's pure half: its decisions and the ownership graph (no I/O).

`plan_dependent` decides what to do with a dependent from the live state of its
owners (solid, dangling, or waiting on a foreground deletion); `plan_foreground`
whether an owner being deleted in the foreground may drop its finalizer, and
which dependents are still in its way.  `Graph` is the in-memory ownership
graph the collector's watches maintain: small `Node`s (uid, identity, owner uids
with their `blockOwnerDeletion`, dependent uids) for the objects that take part
in ownership, virtual nodes for owners named but not seen yet, and callbacks
that hand the uids whose situation changed to the collector's queues.  The
collector that feeds it and acts on its decisions is
`fleet/controllers/garbagecollector.py`.  Everything here is tested without I/O
in tests/unit/controllers/test_garbagecollector.py.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fleet._core.supervise import object_failed

log = logging.getLogger(__name__)

FOREGROUND_FINALIZER = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"
BACKGROUND, FOREGROUND, ORPHAN = "Background", "Foreground", "Orphan"

DELETED_MEMORY = 4096  # recently deleted uids remembered (a virtual owner that is one needs no GET)
REPORTED_MEMORY = 4096  # objects whose malformed ownerReferences were already logged

SOLID, DANGLING, WAITING = "solid", "dangling", "waiting"


# ---------------------------------------------------------------------------------------
# Pure decisions


@dataclass(frozen=True)
class Action:
    """What to do with one dependent.

    `kind`: "none"; "remove-refs" (drop the references to `uids`, the object
    has another live owner); "delete" with `policy`, after first setting
    `blockOwnerDeletion: false` on its references when `unblock` (breaks a
    foreground wait cycle)."""

    kind: str
    uids: tuple[str, ...] = ()
    policy: str = ""
    unblock: bool = False


NOTHING = Action("none")


def plan_dependent(owner_states: Iterable[tuple[str, str]], finalizers: Iterable[str], *,
                   has_dependents: bool, dependent_deleting_dependents: bool) -> Action:
    """Decide about a dependent from the live state of each owner: (uid, solid|dangling|waiting).

    `waiting` is an owner being deleted in the foreground.  With a solid owner
    left, only the references to dangling and waiting owners go (so a foreground
    owner does not wait for an object someone else still owns).  Otherwise the
    object is garbage: if a foreground owner waits for it and it has dependents
    of its own it is deleted in the foreground too (the wait propagates down the
    chain); else with the policy its own GC finalizer asks for, Background by
    default."""
    states = list(owner_states)
    solid = [u for u, s in states if s == SOLID]
    gone = tuple(u for u, s in states if s in (DANGLING, WAITING))
    if solid:
        return Action("remove-refs", gone) if gone else NOTHING
    if not states:
        return NOTHING
    if any(s == WAITING for _, s in states) and has_dependents:
        return Action("delete", policy=FOREGROUND, unblock=dependent_deleting_dependents)
    fins = set(finalizers)
    if ORPHAN_FINALIZER in fins:
        policy = ORPHAN
    elif FOREGROUND_FINALIZER in fins:
        policy = FOREGROUND
    else:
        policy = BACKGROUND
    return Action("delete", policy=policy)


def plan_foreground(owner_uid: str, dependents: Iterable[Node]) -> tuple[bool, list[str]]:
    """May an owner being deleted in the foreground drop its finalizer?

    Returns (done, uids to push): done when no dependent blocks it (a dependent
    blocks while its reference to the owner has `blockOwnerDeletion: true`);
    otherwise the blocking dependents that are not themselves waiting on their
    own dependents are pushed to be deleted (again)."""
    blocking = [d for d in dependents if d.blocks(owner_uid)]
    if not blocking:
        return True, []
    return False, [d.uid for d in blocking if not d.deleting_dependents]


# ---------------------------------------------------------------------------------------
# The graph


class Node:
    """One object in the ownership graph, kept small (10,000 pods ≈ a few MB)."""

    __slots__ = ("api_version", "being_deleted", "deleting_dependents", "dependents", "kind", "name",
                 "namespace", "observed", "orphaning", "owners", "uid")

    def __init__(self, uid: str, api_version: str, kind: str, namespace: str, name: str, *,
                 observed: bool) -> None:
        self.uid = uid
        self.api_version = api_version
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.observed = observed  # seen through a watch or a live GET; False: a virtual owner
        self.owners: tuple[tuple[str, bool], ...] = ()  # (owner uid, blockOwnerDeletion)
        self.dependents: set[str] | None = None  # None while empty: most nodes are leaves
        self.being_deleted = False
        self.deleting_dependents = False  # deletionTimestamp + foregroundDeletion
        self.orphaning = False  # deletionTimestamp + orphan

    def blocks(self, owner_uid: str) -> bool:
        return any(u == owner_uid and block for u, block in self.owners)

    def dependent_uids(self) -> list[str]:
        return list(self.dependents or ())

    def __repr__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"<{self.kind} {where}{self.name} {self.uid}{'' if self.observed else ' virtual'}>"


def owner_ref_problem(ref: Any) -> str | None:
    """Why `ref` cannot name an owner, or None if it can.

    A reference needs a string apiVersion, kind, name and uid.  Anything else (an
    empty kind, a number for a name) names nothing the API serves, so following it
    could only fail — forever, with back-off — and the collector ignores it."""
    if not isinstance(ref, dict):
        return f"an ownerReference is a {type(ref).__name__}"
    for field in ("apiVersion", "kind", "name", "uid"):
        v = ref.get(field)
        if not isinstance(v, str) or not v:
            return f"ownerReference {field} is {v!r}"
    return None


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


class Graph:
    """Owner uid → dependent uids, maintained from watch events; no I/O.

    Whenever a node's situation changes, the uids that need a look are handed to
    `to_delete` (attempt-to-delete: verify a virtual owner, collect a dependent,
    or finish a foreground owner) or `to_orphan`."""

    def __init__(self, to_delete: Callable[[str], None], to_orphan: Callable[[str], None]) -> None:
        self.nodes: dict[str, Node] = {}
        self.to_delete = to_delete
        self.to_orphan = to_orphan
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._reported: OrderedDict[str, None] = OrderedDict()  # uids with bad refs, logged once
        self._strings: dict[str, str] = {}  # shared copies of apiVersions, kinds, namespaces

    def _intern(self, s: str) -> str:
        return self._strings.setdefault(s, s)

    def was_deleted(self, uid: str) -> bool:
        return uid in self._deleted

    # -- events ------------------------------------------------------------------------------
    def observe(self, obj: dict[str, Any]) -> None:
        """An object as a watch or list shows it (ADDED / MODIFIED)."""
        md = obj.get("metadata") or {}
        uid = md.get("uid")
        if not uid:
            return
        refs = self._valid_refs(obj)
        deleting = bool(md.get("deletionTimestamp"))
        fins = md.get("finalizers") or ()
        foreground = deleting and FOREGROUND_FINALIZER in fins
        orphaning = deleting and ORPHAN_FINALIZER in fins
        node = self.nodes.get(uid)
        if node is None:
            if not refs and not foreground and not orphaning:
                return  # takes no part in ownership
            node = Node(uid, self._intern(str(obj.get("apiVersion") or "")), self._intern(str(obj.get("kind") or "")),
                        self._intern(md.get("namespace") or ""), str(md.get("name") or ""), observed=True)
            self.nodes[uid] = node
            was_foreground = was_orphaning = False
        else:
            was_foreground, was_orphaning = node.deleting_dependents, node.orphaning
            if not node.observed:
                self._identify(node, obj)
        self._set_owners(node, refs)
        node.being_deleted = deleting
        node.deleting_dependents = foreground
        node.orphaning = orphaning
        if foreground and not was_foreground:
            for d in node.dependent_uids():
                self.to_delete(d)
            self.to_delete(uid)
        if orphaning and not was_orphaning:
            self.to_orphan(uid)
        self._prune(node)

    def _valid_refs(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The object's ownerReferences that can name an owner; the others are
        skipped, with one log line (and count) per object, not one per event."""
        md = obj.get("metadata") or {}
        raw = md.get("ownerReferences") or []
        if not isinstance(raw, list):
            raw = [raw]
        good = []
        for r in raw:
            problem = owner_ref_problem(r)
            if problem is None:
                good.append(r)
                continue
            uid = str(md.get("uid"))
            if uid not in self._reported:
                self._reported[uid] = None
                if len(self._reported) > REPORTED_MEMORY:
                    self._reported.popitem(last=False)
                object_failed("garbagecollector", str(obj.get("kind") or ""),
                              f"{md.get('namespace') or ''}/{md.get('name') or ''}", ValueError(problem),
                              action="ignoring that ownerReference", logger=log)
        return good

    def confirm(self, uid: str, obj: dict[str, Any]) -> None:
        """A live GET found the object behind a virtual node: it exists."""
        node = self.nodes.get(uid)
        if node is None or node.observed or uid in self._deleted:
            return  # removed meanwhile, or a watch event already told us more
        self.observe(obj)

    def remove(self, uid: str, *, gone: bool = True) -> None:
        """The object is gone (a DELETED event, or a live GET by its exact identity
        found it missing), or — `gone=False` — a virtual owner could not be found
        where its dependent said (it may still exist elsewhere)."""
        if gone:
            self._deleted[uid] = None
            if len(self._deleted) > DELETED_MEMORY:
                self._deleted.popitem(last=False)
        node = self.nodes.pop(uid, None)
        if node is None:
            return
        for owner_uid, _ in node.owners:
            owner = self.nodes.get(owner_uid)
            if owner is not None and owner.dependents is not None:
                owner.dependents.discard(uid)
                if owner.deleting_dependents:
                    self.to_delete(owner_uid)  # maybe its last blocking dependent
                self._prune(owner)
        for d in node.dependent_uids():
            self.to_delete(d)  # maybe their last owner

    def relisted(self, api_group: str, kind: str, seen: set[str]) -> None:
        """After a (re-)list of one resource: its objects we knew but the list lacks are gone."""
        for uid, node in list(self.nodes.items()):
            if node.observed and node.kind == kind and group_of(node.api_version) == api_group \
                    and uid not in seen:
                self.remove(uid)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _identify(self, node: Node, obj: dict[str, Any]) -> None:
        md = obj.get("metadata") or {}
        node.api_version = self._intern(str(obj.get("apiVersion") or node.api_version))
        node.kind = self._intern(str(obj.get("kind") or node.kind))
        node.namespace = self._intern(md.get("namespace") or "")
        node.name = str(md.get("name") or node.name)
        node.observed = True

    def _set_owners(self, node: Node, refs: list[dict[str, Any]]) -> None:
        new: dict[str, bool] = {}
        for r in refs:
            new[str(r["uid"])] = new.get(str(r["uid"]), False) or bool(r.get("blockOwnerDeletion"))
        old = dict(node.owners)
        if new == old:
            return
        for owner_uid, block in old.items():
            owner = self.nodes.get(owner_uid)
            if owner is None:
                continue
            if owner_uid not in new:
                if owner.dependents is not None:
                    owner.dependents.discard(node.uid)
                if owner.deleting_dependents:
                    self.to_delete(owner_uid)  # one blocker fewer
                self._prune(owner)
            elif block and not new[owner_uid] and owner.deleting_dependents:
                self.to_delete(owner_uid)  # no longer blocks it
        owners: list[tuple[str, bool]] = []
        by_uid = {str(r["uid"]): r for r in refs}
        for owner_uid, block in new.items():
            owner = self.nodes.get(owner_uid)
            if owner is None:
                ref = by_uid[owner_uid]
                # Not seen yet: a virtual owner, verified by a live GET (it may never have existed).
                owner = Node(owner_uid, self._intern(str(ref.get("apiVersion") or "")),
                             self._intern(str(ref.get("kind") or "")), node.namespace, str(ref.get("name") or ""),
                             observed=False)
                self.nodes[owner_uid] = owner
                self.to_delete(owner_uid)
            if owner.dependents is None:
                owner.dependents = set()
            if node.uid not in owner.dependents:
                owner.dependents.add(node.uid)
                if owner.deleting_dependents:
                    self.to_delete(node.uid)
            owners.append((owner.uid, block))  # the owner node's string: one copy per owner
        node.owners = tuple(owners)

    def _prune(self, node: Node) -> None:
        """Forget a node that no longer takes part in ownership."""
        if node.dependents:
            return
        if node.observed and (node.owners or node.deleting_dependents or node.orphaning):
            return
        if self.nodes.get(node.uid) is node:
            del self.nodes[node.uid]

    def dependents_of(self, uid: str) -> list[Node]:
        owner = self.nodes.get(uid)
        if owner is None:
            return []
        return [d for d in (self.nodes.get(u) for u in owner.dependent_uids()) if d is not None]

    def stats(self) -> dict[str, int]:
        virtual = sum(1 for n in self.nodes.values() if not n.observed)
        edges = sum(len(n.owners) for n in self.nodes.values())
        return {"nodes": len(self.nodes), "virtual": virtual, "edges": edges}
