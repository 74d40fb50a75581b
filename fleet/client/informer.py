"""A minimal informer: list, then watch from the list's revision, into a local cache.

The scheduler's and the controllers' views of the cluster come from here.  `Informer.run`
lists the collection, reports every difference from what it held before as
ADDED / MODIFIED / DELETED to `on_event` (so a re-list after a 410 or a
lost connection heals the cache without the handler caring why), then
follows the watch.  Handlers are synchronous: they only update in-memory
state, so an event is applied completely before the next one.

One object can never stop an informer (Kubernetes' rule: no stored object may
crash a controller or the scheduler).  Two guards, both logged with the
object's key and counted in `fleet_object_errors_total` (fleet._core.supervise):

* `malformed(obj)` checks the envelope every kind shares — metadata a mapping
  with a string name, labels/annotations string maps, ownerReferences a list,
  spec and status mappings when present.  An object failing it is never put in
  the cache nor handed to a handler (an update that breaks it is skipped: the
  cache keeps the last good version), so handlers may rely on that shape.
* A handler that raises on one event is logged and counted; the informer goes
  on with the next event.  Deeper type errors (a `replicas: "abc"`) land here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import trio

from fleet._core.supervise import object_failed
from fleet.api.meta import malformed
from fleet.client import ApiException, Client

log = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None]


def object_key(obj: dict[str, Any]) -> str:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(md, dict):
        return "/"
    return f"{md.get('namespace') or ''}/{md.get('name', '')}"


def kind_of(obj: Any, default: str = "") -> str:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) and kind else default


class Informer:
    def __init__(self, client: Client, api_version: str, plural: str, on_event: EventHandler, *,
                 field_selector: str | None = None, retry_backoff: float = 1.0,
                 component: str = "informer") -> None:
        self.client = client
        self.component = component  # who runs it: the label of its error counts
        self.api_version = api_version
        self.plural = plural
        self.on_event = on_event
        self.field_selector = field_selector
        self.retry_backoff = retry_backoff
        self.items: dict[str, dict[str, Any]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """List and watch forever; `started` after the first complete list."""
        started = False
        backoff = self.retry_backoff
        while True:
            try:
                listed = await self.client.list_all(self.api_version, self.plural,
                                                    field_selector=self.field_selector)
                self._replace(listed.get("items") or [])
                if not started:
                    started = True
                    task_status.started()
                backoff = self.retry_backoff
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                async for event in self.client.watch(self.api_version, self.plural,
                                                     resource_version=rv,
                                                     field_selector=self.field_selector):
                    self._apply(event.get("type", ""), event.get("object") or {})
            except ApiException as e:
                # 410 Expired: our revision was compacted away; a fresh list catches up.
                if e.code != 410:
                    log.warning("%s informer: %s; re-listing in %.1fs", self.plural, e, backoff)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
            except (httpx.HTTPError, OSError) as e:
                log.warning("%s informer: %r; re-listing in %.1fs", self.plural, e, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _admit(self, obj: Any) -> bool:
        """False (logged and counted) for an object without the common envelope."""
        why = malformed(obj)
        if why is None:
            return True
        object_failed(self.component, kind_of(obj, self.plural), object_key(obj), ValueError(why),
                      action="ignoring it", logger=log)
        return False

    def _dispatch(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        try:
            self.on_event(etype, old, new)
        except Exception as e:  # noqa: BLE001 - one object must not stop the informer
            obj = new if new is not None else old
            object_failed(self.component, kind_of(obj, self.plural), object_key(obj or {}), e,
                          action=f"{etype} handler failed; skipping the event", logger=log)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh: dict[str, dict[str, Any]] = {}
        for o in items:
            if self._admit(o):
                fresh[object_key(o)] = o
            elif object_key(o) in self.items:
                # Broken since we cached it: keep the last good version (as a
                # skipped watch update does), rather than call it deleted.
                fresh[object_key(o)] = self.items[object_key(o)]
        for key in [k for k in self.items if k not in fresh]:
            self._dispatch("DELETED", self.items.pop(key), None)
        for key, obj in fresh.items():
            old = self.items.get(key)
            self.items[key] = obj
            if old is None:
                self._dispatch("ADDED", None, obj)
            elif old is not obj and old["metadata"].get("resourceVersion") != obj["metadata"].get(
                    "resourceVersion"):
                self._dispatch("MODIFIED", old, obj)

    def _apply(self, etype: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        if etype == "DELETED":
            # A malformed object's deletion still removes whatever we held under its key.
            old = self.items.pop(key, None)
            if old is not None:
                self._dispatch("DELETED", old, None)
        elif etype in ("ADDED", "MODIFIED"):
            if not self._admit(obj):
                return
            old = self.items.get(key)
            self.items[key] = obj
            self._dispatch("ADDED" if old is None else "MODIFIED", old, obj)
