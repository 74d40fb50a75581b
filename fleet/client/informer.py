"""The informer: list, then watch from the list's revision, into an indexed local cache.

Every role's view of the cluster comes from here — the scheduler, every controller
(node lifecycle and node IPAM included), and the agent's pod and node watches.  It is
client-go's SharedIndexInformer, in one class:

    API ──list──▶ _replace: every difference from the cache ──▶ indexes ──▶ handlers
        ──watch─▶ _apply:   one event                       ──▶ indexes ──▶ handlers

* **List, then watch** from the list's resourceVersion.  A `410 Expired` answer (our
  revision was compacted away) or a lost connection (the client's watch gave up
  reconnecting) ends in a fresh list, and that *re-list reports every difference*
  from what the cache held as ADDED / MODIFIED / DELETED — objects that vanished
  while we were away become DELETED, an object deleted and re-created under the same
  name becomes DELETED + ADDED (two uids are two objects) — so handlers heal without
  caring why.
* **Indexes** (`add_index`): named functions object → values ("by node", "by owner
  uid", ...) answer "which objects does X own" without a scan.  `by_namespace` is
  always there: `list(namespace)` uses it.
* **Handlers** (`add_handler(fn(etype, old, new))`, or `add_event_handler(on_add=,
  on_update=, on_delete=)`) are synchronous: they only update memory or enqueue a
  key into a work queue, so an event is applied completely before the next one.
* **Resync** (`resync_period`, off by default): every N seconds every cached object is
  handed to the handlers again as MODIFIED (old is new), as client-go's resync does —
  for controllers that want a periodic look even when nothing changed.
* **`synced` / `wait_synced()`**: set after the first complete list.
* **Selectors**: `namespace`, `field_selector`, `label_selector` narrow the list and
  the watch alike (the agent watches only `spec.nodeName=<itself>`).

One object can never stop an informer (Kubernetes' rule: no stored object may crash
a controller or the scheduler).  Guards, each logged with the object's key and
counted in `fleet_object_errors_total` (fleet._core.supervise):

* `malformed(obj)` checks the envelope every kind shares — metadata a mapping with a
  string name, labels/annotations string maps, ownerReferences a list, spec and status
  mappings when present.  An object failing it is never put in the cache nor handed
  to a handler (an update that breaks it is skipped: the cache keeps the last good
  version), so handlers may rely on that shape.  `on_malformed(obj, why)`, if given,
  reports it instead (the agent adds an Event on the pod).
* An index function raising on one object leaves that object out of that index; the
  other indexes and the handlers still see it.
* A handler that raises on one event is logged and counted; the other handlers, and
  the informer, go on.  Deeper type errors (a `replicas: "abc"`) land here.

`InformerFactory` hands out one informer per (resource, selector) however many users
ask, and starts them all; the controller manager owns one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import trio

from fleet._core.supervise import object_failed
from fleet.api.meta import malformed
from fleet.client import ApiException, Client

log = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None]
IndexFunc = Callable[[dict[str, Any]], Iterable[str]]


def object_key(obj: dict[str, Any]) -> str:
    """"namespace/name" (or "/name" for cluster-scoped objects): the cache and queue key."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(md, dict):
        return "/"
    return f"{md.get('namespace') or ''}/{md.get('name', '')}"


def kind_of(obj: Any, default: str = "") -> str:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) and kind else default


def by_namespace(obj: dict[str, Any]) -> list[str]:
    """Index: the object's namespace ("" for cluster-scoped objects)."""
    return [str((obj.get("metadata") or {}).get("namespace") or "")]


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _rv(obj: dict[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


class Informer:
    """A list+watch cache of one resource, with indexes and any number of handlers."""

    def __init__(self, client: Client, api_version: str, plural: str,
                 on_event: EventHandler | None = None, *, namespace: str | None = None,
                 field_selector: str | None = None, label_selector: str | None = None,
                 resync_period: float | None = None, retry_backoff: float = 1.0,
                 component: str = "informer",
                 on_malformed: Callable[[Any, str], None] | None = None,
                 transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.client = client
        self.component = component  # who runs it: the label of its error counts
        self.api_version = api_version
        self.plural = plural
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.resync_period = resync_period
        self.retry_backoff = retry_backoff
        # Who reports an object without the common envelope (default: log + count
        # here); the agent also puts a FailedSync Event on it.
        self.on_malformed = on_malformed
        # client-go's SetTransform: what of each object is kept (the garbage collector
        # keeps metadata only); applied before the envelope check.
        self.transform = transform
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = trio.Event()
        self.relists = 0  # lists after the first (410s, lost connections): tests and logs read it
        self._handlers: list[EventHandler] = []
        self._indexers: dict[str, IndexFunc] = {}
        self._indexes: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        if on_event is not None:
            self._handlers.append(on_event)
        # Here, not in run(): handlers of *other* informers may call list(ns) on this
        # one before it has started.
        self.add_index("namespace", by_namespace)

    # -- reading -----------------------------------------------------------------------
    @property
    def cache(self) -> dict[str, dict[str, Any]]:
        return self.items

    @property
    def has_synced(self) -> bool:
        return self.synced.is_set()

    async def wait_synced(self) -> None:
        """Return once the first complete list is in the cache (at once after that)."""
        await self.synced.wait()

    def get(self, key: str) -> dict[str, Any] | None:
        return self.items.get(key)

    def list(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return list(self.items.values())
        return self.by_index("namespace", namespace)

    def by_index(self, name: str, value: str) -> list[dict[str, Any]]:
        return list(self._indexes[name].get(value, {}).values())

    # -- wiring ------------------------------------------------------------------------
    def add_handler(self, handler: EventHandler) -> None:
        """`handler(etype, old, new)` for every ADDED / MODIFIED / DELETED from now on."""
        self._handlers.append(handler)

    def remove_handler(self, handler: EventHandler) -> None:
        """Stop calling `handler` (a task that shares an informer it does not own
        detaches this way when it ends); unknown handlers are ignored."""
        with contextlib.suppress(ValueError):
            self._handlers.remove(handler)

    def add_event_handler(self, *, on_add: Callable[[dict[str, Any]], None] | None = None,
                          on_update: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
                          on_delete: Callable[[dict[str, Any]], None] | None = None) -> None:
        """client-go's ResourceEventHandlerFuncs: one function per kind of change."""

        def handler(etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            if etype == "ADDED" and on_add is not None and new is not None:
                on_add(new)
            elif etype == "MODIFIED" and on_update is not None and old is not None and new is not None:
                on_update(old, new)
            elif etype == "DELETED" and on_delete is not None and old is not None:
                on_delete(old)

        handler.__qualname__ = f"event handler of {self.plural}"
        self._handlers.append(handler)

    def add_index(self, name: str, fn: IndexFunc) -> None:
        if name in self._indexers:
            return
        self._indexers[name] = fn
        idx: dict[str, dict[str, dict[str, Any]]] = {}
        for key, obj in self.items.items():
            for v in self._index_values(name, fn, obj):
                idx.setdefault(v, {})[key] = obj
        self._indexes[name] = idx

    # -- running -----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """List and watch forever; `started` after the first complete list."""
        async with trio.open_nursery() as n:
            if self.resync_period:
                n.start_soon(self._resync_loop, self.resync_period)
            await self._list_and_watch(task_status)

    async def _list_and_watch(self, task_status: trio.TaskStatus[None]) -> None:
        backoff = self.retry_backoff
        while True:
            try:
                listed = await self.client.list_all(self.api_version, self.plural, self.namespace,
                                                    label_selector=self.label_selector,
                                                    field_selector=self.field_selector)
                self._replace(listed.get("items") or [])
                if not self.synced.is_set():
                    self.synced.set()
                    task_status.started()
                else:
                    self.relists += 1
                backoff = self.retry_backoff
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                async for event in self.client.watch(self.api_version, self.plural, self.namespace,
                                                     resource_version=rv,
                                                     label_selector=self.label_selector,
                                                     field_selector=self.field_selector):
                    self._apply(event.get("type", ""), event.get("object") or {})
                # The watch ended without an error (a client that does not reconnect):
                # a fresh list picks up whatever happened since.
            except ApiException as e:
                # 410 Expired: our revision was compacted away; a fresh list catches up.
                if e.code != 410:
                    log.warning("%s informer: %s; re-listing in %.1fs", self.plural, e, backoff)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                else:
                    log.info("%s informer: watch expired (410); re-listing", self.plural)
            except (httpx.HTTPError, OSError) as e:
                log.warning("%s informer: %r; re-listing in %.1fs", self.plural, e, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _resync_loop(self, period: float) -> None:
        await self.synced.wait()
        while True:
            await trio.sleep(period)
            self.resync()

    def resync(self) -> None:
        """Hand every cached object to the handlers again, as MODIFIED with old == new."""
        for obj in list(self.items.values()):
            self._notify("MODIFIED", obj, obj)

    # -- applying changes --------------------------------------------------------------
    def _admit(self, obj: Any) -> bool:
        """False (logged and counted) for an object without the common envelope."""
        why = malformed(obj)
        if why is None:
            return True
        return self._reject(obj, why)

    def _prepare(self, obj: Any) -> dict[str, Any] | None:
        """The object as the cache keeps it (transformed), or None if it is malformed."""
        if self.transform is not None and isinstance(obj, dict):
            try:
                obj = self.transform(obj)
            except Exception as e:  # noqa: BLE001 - one object must not stop the informer
                self._reject(obj, f"transform failed: {e!r}")
                return None
        return obj if self._admit(obj) else None

    def _reject(self, obj: Any, why: str) -> bool:
        """Report a malformed object (through `on_malformed`, else log + count); False."""
        if self.on_malformed is not None:
            try:
                self.on_malformed(obj, why)
                return False
            except Exception as e:  # noqa: BLE001 - the report failing must not stop the informer
                log.warning("%s informer: reporting a malformed object failed: %r", self.plural, e)
        object_failed(self.component, kind_of(obj, self.plural), object_key(obj), ValueError(why),
                      action="ignoring it", logger=log)
        return False

    def _index_values(self, name: str, fn: IndexFunc, obj: dict[str, Any]) -> list[str]:
        """`fn(obj)`, or nothing if it raises: the object is missing from that one
        index (logged and counted) instead of the informer stopping for everyone."""
        try:
            return list(fn(obj))
        except Exception as e:  # noqa: BLE001 - isolate one object
            object_failed(self.component, kind_of(obj, self.plural), object_key(obj), e,
                          action=f"left out of the {name!r} index", logger=log)
            return []

    def _reindex(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for name, fn in self._indexers.items():
            idx = self._indexes[name]
            if old is not None:
                for v in self._index_values(name, fn, old):
                    bucket = idx.get(v)
                    if bucket is not None:
                        bucket.pop(key, None)
                        if not bucket:
                            del idx[v]
            if new is not None:
                for v in self._index_values(name, fn, new):
                    idx.setdefault(v, {})[key] = new

    def _notify(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for h in self._handlers:
            try:
                h(etype, old, new)
            except Exception as e:  # noqa: BLE001 - one object must not stop the informer
                obj = new if new is not None else old
                object_failed(self.component, kind_of(obj, self.plural), object_key(obj or {}), e,
                              action=f"{etype} handler {getattr(h, '__qualname__', h)} failed; "
                                     "skipping the event", logger=log)

    def _set(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """Cache, indexes, then handlers: a handler always reads a cache that has the change."""
        if new is None:
            self.items.pop(key, None)
        else:
            self.items[key] = new
        self._reindex(key, old, new)
        self._notify("DELETED" if new is None else "ADDED" if old is None else "MODIFIED", old, new)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        """A (re-)list: report every difference from the cache, deletions first."""
        fresh: dict[str, dict[str, Any]] = {}
        for raw in items:
            o = self._prepare(raw)
            if o is not None:
                fresh[object_key(o)] = o
            elif object_key(raw) in self.items:
                # Broken since we cached it: keep the last good version (as a
                # skipped watch update does), rather than call it deleted.
                fresh[object_key(raw)] = self.items[object_key(raw)]
        for key in [k for k in self.items if k not in fresh]:
            self._set(key, self.items[key], None)
        for key, obj in fresh.items():
            old = self.items.get(key)
            if old is None:
                self._set(key, None, obj)
            elif old is obj or _rv(old) == _rv(obj):
                continue
            elif _uid(old) and _uid(obj) and _uid(old) != _uid(obj):
                # Deleted and re-created under the same name while we were not
                # watching: two objects, as a watch would have shown them.
                self._set(key, old, None)
                self._set(key, None, obj)
            else:
                self._set(key, old, obj)

    def _apply(self, etype: str, obj: dict[str, Any]) -> None:
        """One watch event."""
        key = object_key(obj)
        if etype == "DELETED":
            # A malformed object's deletion still removes whatever we held under its key.
            old = self.items.get(key)
            if old is not None:
                self._set(key, old, None)
        elif etype in ("ADDED", "MODIFIED"):
            kept = self._prepare(obj)
            if kept is not None:
                self._set(key, self.items.get(key), kept)


# The controllers' name for it (client-go's SharedIndexInformer): the same class.
SharedInformer = Informer


class InformerFactory:
    """Hands out one informer per resource and selector; `run` starts them all."""

    def __init__(self, client: Client, *, component: str = "controller-manager") -> None:
        self.client = client
        self.component = component
        self._informers: dict[tuple[str, str, str | None], Informer] = {}

    def informer(self, api_version: str, plural: str, *,
                 field_selector: str | None = None) -> Informer:
        k = (api_version, plural, field_selector)
        inf = self._informers.get(k)
        if inf is None:
            inf = self._informers[k] = Informer(self.client, api_version, plural,
                                                field_selector=field_selector,
                                                component=self.component)
        return inf

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every informer asked for so far; `started` when all have listed."""
        async with trio.open_nursery() as n:
            for inf in list(self._informers.values()):
                await n.start(inf.run)
            task_status.started()
