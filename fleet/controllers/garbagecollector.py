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
in-memory bookkeeping with no I/O.  They live in
`fleet/controllers/garbagecollector_graph.py`; this module owns the I/O around
them: discovery and one metadata informer per resource (the monitors), the
attempt-to-delete and attempt-to-orphan queues and their workers, the live
GETs that verify owners, and the DELETEs and PATCHes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import trio

from fleet._core.supervise import object_failed
from fleet.client import JSON_PATCH, ApiException, APIResource, Client
from fleet.client.informer import Informer
from fleet.controllers.garbagecollector_graph import (
    DANGLING,
    FOREGROUND_FINALIZER,
    ORPHAN_FINALIZER,
    SOLID,
    WAITING,
    Graph,
    Node,
    group_of,
    owner_ref_problem,
    plan_dependent,
    plan_foreground,
)
from fleet.controllers.runtime import Context, WorkQueue

log = logging.getLogger(__name__)

# (group, resource) never watched: Events are high-volume and never owners (Kubernetes ignores them too).
IGNORED_RESOURCES = frozenset({("", "events"), ("events.k8s.io", "events")})

DISCOVERY_INTERVAL = 30.0
SYNC_TIMEOUT = 60.0
ABSENT_CACHE_SIZE = 500
PATCH_ATTEMPTS = 5
NAMESPACE_POLL = 1.0  # how often a namespace's GC finalizer waits for its content to be gone


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
    finalizer back until the namespace controller has emptied the namespace
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
