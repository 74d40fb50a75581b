"""Garbage collector: cascading deletion through ownerReferences.

The API server's half of cascading deletion (fleet/server/deletion.py) turns a
DELETE's propagation policy into finalizers; this controller does the rest, as
kube-controller-manager's garbage collector does:

* **Background** — an owner is gone: every dependent whose owners are *all*
  gone is deleted (a dependent with another live owner only loses the dangling
  reference).
* **Foreground** — an owner carries `deletionTimestamp` and the
  `foregroundDeletion` finalizer: its dependents are deleted (those that have
  dependents of their own in the Foreground too, so the wait runs down the
  chain) and the finalizer is removed once no dependent with
  `blockOwnerDeletion: true` is left.
* **Orphan** — an owner carries the `orphan` finalizer: the references to it
  are removed from its dependents, then the finalizer.

    per resource: informer (metadata) ─▶ Graph (owner uid ─▶ dependent uids)
                                              │ enqueue uids whose situation changed
              attempt-to-delete queue ◀───────┤
              attempt-to-orphan queue ◀───────┘
                     │ workers: live GETs, then DELETE / PATCH through the API

**The graph.** Every deletable resource the API's discovery lists (events
excepted, as in Kubernetes) is watched, but only objects that take part in
ownership are kept, and only as small `Node`s (uid, identity, owner uids with
their `blockOwnerDeletion`, dependent uids): dependents (objects with
ownerReferences), the owners they name, and objects carrying a GC finalizer.
An owner named by a dependent but not seen yet is a *virtual* node, verified
with a live GET.  An object that owns nothing and is owned by nothing costs
only a few metadata fields in its resource's informer cache (fleet.client.informer,
which re-lists after a 410 or a lost connection and reports what vanished meanwhile
as DELETED).

**Never act on a stale cache.** Before deleting a dependent the collector
re-reads it and each of its owners from the API, by name, and compares uids:
an owner that is missing, or whose name now belongs to a different uid (the
owner was deleted and re-created), is dangling.  The delete itself carries the
dependent's uid and resourceVersion as preconditions.  Absent owners are
remembered in a small LRU so a thousand pods of one deleted ReplicaSet cost
one owner lookup, not a thousand.

**Scope rules.** A namespaced dependent's owner is looked up in the
dependent's namespace (a cluster-scoped owner anywhere); a cluster-scoped
dependent naming a namespaced owner is invalid: the reference is ignored and a
Warning `OwnerRefInvalidNamespace` event recorded, as Kubernetes does.

Workers start only once every resource has been listed (or a sync timeout has
passed), so a foreground deletion never completes for lack of a dependent the
graph had not seen yet; after a restart the initial lists re-create every
pending foreground and orphan deletion, which is how an interrupted deletion
resumes.  Discovery is repeated every DISCOVERY_INTERVAL, so kinds added later
(CRDs) are watched too.

The decisions are pure and table-tested: `plan_dependent` (what to do with a
dependent given the state of its owners) and `plan_foreground` (may a
foreground owner finish, and who is still in the way); `Graph` is the
in-memory bookkeeping with no I/O.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import trio

from fleet._core.supervise import object_failed
from fleet.client import JSON_PATCH, ApiException, APIResource, Client
from fleet.client.informer import Informer
from fleet.controllers.runtime import Context, WorkQueue

log = logging.getLogger(__name__)

FOREGROUND_FINALIZER = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"
BACKGROUND, FOREGROUND, ORPHAN = "Background", "Foreground", "Orphan"

# (group, resource) never watched: Events are high-volume and never owners (Kubernetes ignores them too).
IGNORED_RESOURCES = frozenset({("", "events"), ("events.k8s.io", "events")})

DISCOVERY_INTERVAL = 30.0
SYNC_TIMEOUT = 60.0
ABSENT_CACHE_SIZE = 500
DELETED_MEMORY = 4096  # recently deleted uids remembered (a virtual owner that is one needs no GET)
REPORTED_MEMORY = 4096  # objects whose malformed ownerReferences were already logged
PATCH_ATTEMPTS = 5
NAMESPACE_POLL = 1.0  # how often a namespace's GC finalizer waits for its content to be gone

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


# ---------------------------------------------------------------------------------------
# The controller


class Unmapped(Exception):
    """An ownerReference names a kind the API does not serve (yet): retry later."""


class InvalidReference(Exception):
    """A cluster-scoped dependent names a namespaced owner: never valid, never retried."""


def _refs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if isinstance(r, dict)]


def _uid(obj: dict[str, Any] | None) -> str | None:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    uid = md.get("uid") if isinstance(md, dict) else None
    return uid if isinstance(uid, str) and uid else None


def namespace_not_finalized(obj: dict[str, Any]) -> bool:
    """A Namespace whose content the namespace controller has not removed yet.

    Removing the last metadata finalizer deletes an object; Kubernetes keeps a
    namespace until its `spec.finalizers` are empty as well, and Fleet's store
    does not know about spec.finalizers, so the collector holds its own
    finalizer back until the namespace lifecycle has emptied the namespace
    (it clears spec.finalizers then)."""
    if obj.get("kind") != "Namespace" or str(obj.get("apiVersion")) != "v1":
        return False
    return bool((obj.get("spec") or {}).get("finalizers"))


_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "ownerReferences",
                  "deletionTimestamp", "finalizers")


def _metadata_only(res: APIResource, obj: dict[str, Any]) -> dict[str, Any]:
    """What a monitor's informer keeps of an object: its type and the metadata fields the
    graph reads (list items come without apiVersion and kind: the resource says what
    they are).  Anything that is not a mapping is kept as it is, for the informer's
    envelope check to report."""
    md = obj.get("metadata")
    if not isinstance(md, dict):
        return obj
    return {"apiVersion": obj.get("apiVersion") or res.api_version, "kind": obj.get("kind") or res.kind,
            "metadata": {k: md[k] for k in _KEPT_METADATA if k in md}}


class GarbageCollector:
    """The garbage collector controller (see the module docstring)."""

    name = "garbagecollector"
    delete_workers = 4
    orphan_workers = 2

    def __init__(self, *, discovery_interval: float = DISCOVERY_INTERVAL,
                 sync_timeout: float = SYNC_TIMEOUT) -> None:
        self.discovery_interval = discovery_interval
        self.sync_timeout = sync_timeout
        self.delete_queue = WorkQueue()
        self.orphan_queue = WorkQueue()
        self.graph = Graph(self.delete_queue.add, self.orphan_queue.add)
        self.kinds: dict[tuple[str, str], APIResource] = {}  # (group, kind) -> served resource
        self._monitors: dict[tuple[str, str], trio.CancelScope] = {}  # (group, plural) -> its watch
        self._absent: OrderedDict[tuple[str, str], None] = OrderedDict()  # (owner uid, namespace)
        self._synced: dict[tuple[str, str], trio.Event] = {}
        self.ctx: Context | None = None
        self._client: Client | None = None
        self._watch_client: Client | None = None

    # -- wiring ----------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        # No shared informers: they cache whole objects and the graph needs a few fields;
        # the monitors run informers of their own that keep metadata only.
        self.ctx = ctx

    @property
    def client(self) -> Client:
        """For the workers' reads and writes."""
        if self._client is not None:
            return self._client
        assert self.ctx is not None
        return self.ctx.client

    @property
    def watch_client(self) -> Client:
        """For the monitors' lists and watches."""
        return self._watch_client or self.client

    def _reset(self) -> None:
        """Fresh queues, graph and monitors (also after a crash: the manager restarts `run`)."""
        self.delete_queue = WorkQueue()
        self.orphan_queue = WorkQueue()
        self.graph = Graph(self.delete_queue.add, self.orphan_queue.add)
        self._monitors = {}
        self._synced = {}
        self._absent = OrderedDict()

    async def run(self, ctx: Context) -> None:
        """Discover, list and watch everything, then collect.

        The collector has clients of its own: one carries its ~25 watch
        streams, the other its short requests.  Sharing the manager's client
        would be costly for everyone: httpx (httpcore) closes a returned
        connection whenever the pool holds more than `max_keepalive_connections`
        (20) connections in all, streams included, so with that many watches
        in one pool every request pays a new TLS handshake."""
        self.ctx = ctx
        self._reset()
        agent = "fleet-controller-manager/garbage-collector"
        async with Client(ctx.client.config, user_agent=agent) as work, \
                Client(ctx.client.config, user_agent=agent) as watch:
            self._client, self._watch_client = work, watch
            try:
                await self._run()
            finally:
                self._client = self._watch_client = None

    async def _run(self) -> None:
        resources = await self._discover_until_ok()
        async with trio.open_nursery() as n:
            self._sync_monitors(n, resources)
            with trio.move_on_after(self.sync_timeout) as waited:
                for ev in list(self._synced.values()):
                    await ev.wait()
            if waited.cancelled_caught:
                log.warning("garbage collector: not every resource listed after %.0fs; starting anyway",
                            self.sync_timeout)
            for _ in range(self.delete_workers):
                n.start_soon(self._worker, self.delete_queue, self.attempt_to_delete)
            for _ in range(self.orphan_workers):
                n.start_soon(self._worker, self.orphan_queue, self.attempt_to_orphan)
            n.start_soon(self._rediscover, n)

    # -- discovery and monitors -------------------------------------------------------------
    async def _discover(self) -> list[APIResource]:
        """Every deletable, watchable resource at its preferred version; refreshes `kinds`."""
        served = await self.client.discover(refresh=True)
        kinds: dict[tuple[str, str], APIResource] = {}
        for r in served:
            if r.preferred or (r.group, r.kind) not in kinds:
                kinds[(r.group, r.kind)] = r
        self.kinds = kinds
        out: dict[tuple[str, str], APIResource] = {}
        for r in served:
            if not r.preferred or (r.group, r.name) in IGNORED_RESOURCES:
                continue
            if all(v in r.verbs for v in ("list", "watch", "delete")):
                out[(r.group, r.name)] = r
        return list(out.values())

    async def _discover_until_ok(self) -> list[APIResource]:
        backoff = 1.0
        while True:
            try:
                return await self._discover()
            except (ApiException, httpx.HTTPError, OSError) as e:
                log.warning("garbage collector: discovery failed (%r); retrying in %.0fs", e, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _sync_monitors(self, n: trio.Nursery, resources: list[APIResource]) -> None:
        wanted = {(r.group, r.name): r for r in resources}
        for key, scope in list(self._monitors.items()):
            if key not in wanted:
                scope.cancel()
                del self._monitors[key]
                self._synced.pop(key, None)
        for key, res in wanted.items():
            if key not in self._monitors:
                scope = trio.CancelScope()
                self._monitors[key] = scope
                self._synced[key] = trio.Event()
                n.start_soon(self._monitor, res, scope, self._synced[key])

    async def _rediscover(self, n: trio.Nursery) -> None:
        while True:
            await trio.sleep(self.discovery_interval)
            try:
                self._sync_monitors(n, await self._discover())
            except (ApiException, httpx.HTTPError, OSError) as e:
                log.info("garbage collector: discovery failed (%r); keeping the resources we watch", e)

    async def _monitor(self, res: APIResource, scope: trio.CancelScope, synced: trio.Event) -> None:
        """Follow one resource, forever, through the one client informer: metadata only
        in its cache (the graph needs a few fields of it), and a re-list after a 410
        or a lost connection reports what vanished meanwhile as DELETED."""
        with scope:
            inf = Informer(self.watch_client, res.api_version, res.name, partial(self._on_change, res),
                           component=self.name, transform=partial(_metadata_only, res))
            async with trio.open_nursery() as n:
                await n.start(inf.run)
                synced.set()

    def _on_change(self, res: APIResource, etype: str, old: dict[str, Any] | None,
                   new: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            uid = _uid(old or {})
            if uid:
                self.graph.remove(uid)
        elif new is not None:
            self._observe(res, new)

    def _observe(self, res: APIResource, obj: dict[str, Any]) -> None:
        """Put one object in the graph; one that breaks it is logged and skipped."""
        try:
            if _uid(obj):
                self.graph.observe(obj)
        except Exception as e:  # noqa: BLE001 - one object must not stop the monitor
            md = obj.get("metadata") if isinstance(obj, dict) else None
            md = md if isinstance(md, dict) else {}
            object_failed(self.name, res.kind, f"{md.get('namespace') or ''}/{md.get('name') or ''}", e,
                          logger=log)

    # -- workers --------------------------------------------------------------------------
    async def _worker(self, queue: WorkQueue, fn: Callable[[str], Any]) -> None:
        while True:
            uid = await queue.get()
            try:
                again = await fn(uid)
            except InvalidReference:
                queue.forget(uid)
            except Exception as e:  # noqa: BLE001 - keep collecting; retry this one with back-off
                failures = queue.failures(uid)
                node = self.graph.nodes.get(uid)
                object_failed(self.name, node.kind if node else "", repr(node) if node else uid, e,
                              action=f"{fn.__name__} failed ({failures + 1}); retrying with back-off",
                              logger=log, level=logging.INFO if failures < 5 else logging.DEBUG)
                queue.add_rate_limited(uid)
            else:
                if again is not None:
                    queue.add_after(uid, again)
                else:
                    queue.forget(uid)
            finally:
                queue.done(uid)

    def _resource(self, api_version: str, kind: str) -> APIResource:
        res = self.kinds.get((group_of(api_version), kind))
        if res is None:
            raise Unmapped(f"no resource serves {kind} in {api_version or 'v1'}")
        return res

    async def _get(self, res: APIResource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.client.get_object(res.api_version, res.name, name,
                                                namespace if res.namespaced else None)
        except ApiException as e:
            if e.code == 404:
                return None
            raise

    async def _get_node(self, node: Node) -> dict[str, Any] | None:
        """The live object behind `node`, or None when it (that uid) is gone."""
        res = self._resource(node.api_version, node.kind)
        if res.namespaced and not node.namespace:
            return None  # a namespaced owner named from cluster scope: nothing to find
        obj = await self._get(res, node.namespace, node.name)
        return obj if _uid(obj) == node.uid else None

    async def attempt_to_delete(self, uid: str) -> float | None:
        """Verify a virtual node, finish a foreground owner, or collect a dependent."""
        node = self.graph.nodes.get(uid)
        if node is None:
            return None
        if not node.observed:
            if self.graph.was_deleted(uid):
                self.graph.remove(uid)
                return None
            latest = await self._get_node(node)
            if latest is None:
                self.graph.remove(uid, gone=False)  # never existed, or gone: its dependents get a look
            else:
                self.graph.confirm(uid, latest)
            return None
        if node.being_deleted and not node.deleting_dependents:
            return None  # on its way out; its dependents get a look when it is gone
        latest = await self._get_node(node)
        if latest is None:
            self.graph.remove(uid)  # we missed its deletion
            return None
        lmd = latest.get("metadata") or {}
        if lmd.get("deletionTimestamp") and FOREGROUND_FINALIZER in (lmd.get("finalizers") or ()):
            return await self._finish_foreground(node, latest)
        refs = _refs(latest)
        # Only references that can name an owner are followed; the graph already
        # logged the others when it saw the object.
        valid = [r for r in refs if owner_ref_problem(r) is None]
        if not valid:
            return None
        states = [(str(r.get("uid")), await self._classify(node, latest, r)) for r in valid]
        dependents = self.graph.dependents_of(uid)
        action = plan_dependent(states, lmd.get("finalizers") or (), has_dependents=bool(dependents),
                                dependent_deleting_dependents=any(d.deleting_dependents for d in dependents))
        if action.kind == "remove-refs":
            keep = [r for r in refs if str(r.get("uid")) not in action.uids]
            await self._patch_refs(node, latest, keep)
        elif action.kind == "delete":
            if action.unblock:
                unblocked = [{**r, "blockOwnerDeletion": False} if r.get("blockOwnerDeletion") else r for r in refs]
                latest = await self._patch_refs(node, latest, unblocked) or latest
            await self._delete(node, latest, action.policy)
        return None

    async def _classify(self, node: Node, latest: dict[str, Any], ref: dict[str, Any]) -> str:
        owner_uid = str(ref.get("uid"))
        res = self._resource(str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""))
        if res.namespaced and not node.namespace:
            self._report_invalid(latest, ref)
            raise InvalidReference(f"{node} names namespaced owner {ref.get('kind')} {ref.get('name')}")
        namespace = node.namespace if res.namespaced else ""
        if (owner_uid, namespace) in self._absent:
            return DANGLING
        owner = await self._get(res, namespace, str(ref.get("name") or ""))
        if owner is None or _uid(owner) != owner_uid:
            # Missing, or the name now belongs to a re-created object: the owner we named is gone.
            self._absent[(owner_uid, namespace)] = None
            if len(self._absent) > ABSENT_CACHE_SIZE:
                self._absent.popitem(last=False)
            return DANGLING
        omd = owner.get("metadata") or {}
        if omd.get("deletionTimestamp") and FOREGROUND_FINALIZER in (omd.get("finalizers") or ()):
            return WAITING
        return SOLID

    def _report_invalid(self, obj: dict[str, Any], ref: dict[str, Any]) -> None:
        if self.ctx is None or self.ctx.events is None:
            return
        md = obj.get("metadata") or {}
        ns = md.get("namespace") or ""
        self.ctx.events.record(
            obj, "Warning", "OwnerRefInvalidNamespace",
            f"ownerRef [{ref.get('apiVersion')}/{ref.get('kind')}, namespace: {ns}, name: {ref.get('name')}, "
            f'uid: {ref.get("uid")}] does not exist in namespace "{ns}"')

    async def _finish_foreground(self, node: Node, latest: dict[str, Any]) -> float | None:
        done, push = plan_foreground(node.uid, self.graph.dependents_of(node.uid))
        if done:
            if namespace_not_finalized(latest):
                return NAMESPACE_POLL
            await self._remove_finalizer(node, latest, FOREGROUND_FINALIZER)
            return None
        for uid in push:
            self.delete_queue.add(uid)
        # Nothing to poll: the graph wakes this owner when a blocking dependent goes or stops blocking.
        return None

    async def attempt_to_orphan(self, uid: str) -> float | None:
        """Strip the references to an owner with the `orphan` finalizer, then the finalizer."""
        node = self.graph.nodes.get(uid)
        if node is None or not node.observed:
            return None
        latest = await self._get_node(node)
        if latest is None:
            return None
        lmd = latest.get("metadata") or {}
        if not lmd.get("deletionTimestamp") or ORPHAN_FINALIZER not in (lmd.get("finalizers") or ()):
            return None
        for dep_uid in node.dependent_uids():
            dep = self.graph.nodes.get(dep_uid)
            if dep is not None:
                await self._drop_owner(dep, uid)
        if namespace_not_finalized(latest):
            return NAMESPACE_POLL
        await self._remove_finalizer(node, latest, ORPHAN_FINALIZER)
        return None

    # -- writes -----------------------------------------------------------------------------
    async def _json_patch(self, node: Node, ops: list[dict[str, Any]]) -> dict[str, Any] | None:
        res = self._resource(node.api_version, node.kind)
        try:
            return await self.client.patch(res.api_version, res.name, node.name, ops, JSON_PATCH,
                                           node.namespace if res.namespaced else None)
        except ApiException as e:
            if e.code == 404:
                return None
            raise

    async def _patch_refs(self, node: Node, latest: dict[str, Any], refs: list[dict[str, Any]]
                          ) -> dict[str, Any] | None:
        """Replace the object's ownerReferences, provided they are still what we decided on."""
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": node.uid},
            {"op": "test", "path": "/metadata/ownerReferences", "value": _refs(latest)},
        ]
        if refs:
            ops.append({"op": "replace", "path": "/metadata/ownerReferences", "value": refs})
        else:
            ops.append({"op": "remove", "path": "/metadata/ownerReferences"})
        return await self._json_patch(node, ops)

    async def _drop_owner(self, dep: Node, owner_uid: str) -> None:
        for _ in range(PATCH_ATTEMPTS):
            latest = await self._get_node(dep)
            if latest is None:
                return
            refs = _refs(latest)
            keep = [r for r in refs if str(r.get("uid")) != owner_uid]
            if len(keep) == len(refs):
                return
            try:
                await self._patch_refs(dep, latest, keep)
                return
            except ApiException as e:
                if e.code not in (409, 422):  # 422: a `test` failed, the references moved on
                    raise
        raise RuntimeError(f"could not remove the owner reference {owner_uid} from {dep}")

    async def _remove_finalizer(self, node: Node, latest: dict[str, Any], finalizer: str) -> None:
        for _ in range(PATCH_ATTEMPTS):
            fins = list((latest.get("metadata") or {}).get("finalizers") or [])
            if finalizer not in fins:
                return
            try:
                await self._json_patch(node, [
                    {"op": "test", "path": "/metadata/uid", "value": node.uid},
                    {"op": "test", "path": "/metadata/finalizers", "value": fins},
                    {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in fins if f != finalizer]},
                ])
                return
            except ApiException as e:
                if e.code not in (409, 422):
                    raise
            fresh = await self._get_node(node)
            if fresh is None:
                return
            latest = fresh
        raise RuntimeError(f"could not remove the {finalizer} finalizer from {node}")

    async def _delete(self, node: Node, latest: dict[str, Any], policy: str) -> None:
        """Delete a dependent whose owners are gone, pinned to the state we judged.

        A conflict means it changed meanwhile: if its ownerReferences did not,
        the decision still holds and the delete is repeated with the uid alone
        (pods change status all the time); otherwise it is looked at afresh."""
        res = self._resource(node.api_version, node.kind)
        ns = node.namespace if res.namespaced else None
        md = latest.get("metadata") or {}
        pre: dict[str, Any] = {"uid": node.uid, "resourceVersion": md.get("resourceVersion")}
        for _ in range(2):
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy, "preconditions": pre}
            try:
                await self.client.delete(res.api_version, res.name, node.name, ns, body=body)
                return
            except ApiException as e:
                if e.code == 404:
                    return
                if e.code != 409:
                    raise
            fresh = await self._get_node(node)
            if fresh is None:
                return
            if _refs(fresh) != _refs(latest):
                self.delete_queue.add(node.uid)
                return
            pre = {"uid": node.uid}
        raise RuntimeError(f"could not delete {node}: it keeps changing")

    def stats(self) -> dict[str, int]:
        return {**self.graph.stats(), "resources": len(self._monitors), "delete_queue": len(self.delete_queue),
                "orphan_queue": len(self.orphan_queue)}
