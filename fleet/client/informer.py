"""A minimal informer: list, then watch from the list's revision, into a local cache.

The scheduler's and the controllers' views of the cluster come from here.  `Informer.run`
lists the collection, reports every difference from what it held before as
ADDED / MODIFIED / DELETED to `on_event` (so a re-list after a 410 or a
lost connection heals the cache without the handler caring why), then
follows the watch.  Handlers are synchronous: they only update in-memory
state, so an event is applied completely before the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import trio

from fleet.client import ApiException, Client

log = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None]


def object_key(obj: dict[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace') or ''}/{md.get('name', '')}"


class Informer:
    def __init__(self, client: Client, api_version: str, plural: str, on_event: EventHandler, *,
                 field_selector: str | None = None, retry_backoff: float = 1.0) -> None:
        self.client = client
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

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh = {object_key(o): o for o in items}
        for key in [k for k in self.items if k not in fresh]:
            self.on_event("DELETED", self.items.pop(key), None)
        for key, obj in fresh.items():
            old = self.items.get(key)
            self.items[key] = obj
            if old is None:
                self.on_event("ADDED", None, obj)
            elif (old.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get(
                    "resourceVersion"):
                self.on_event("MODIFIED", old, obj)

    def _apply(self, etype: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        if etype == "DELETED":
            old = self.items.pop(key, None)
            if old is not None:
                self.on_event("DELETED", old, None)
        elif etype in ("ADDED", "MODIFIED"):
            old = self.items.get(key)
            self.items[key] = obj
            self.on_event("ADDED" if old is None else "MODIFIED", old, obj)
