"""Events for what controllers do, so `kubectl describe` shows them.

`EventRecorder.record(obj, type, reason, message)` about any object: the event is
queued and written by background senders (a controller never waits on it), and a
repeat of the same (object uid, type, reason, message) within `dedupe_window` bumps
`count` and `lastTimestamp` of the event already written instead of creating a new
one, as client-go's EventCorrelator does.  When the queue is full events are dropped
and counted — the work the event describes matters more than the event.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio

from fleet.client import MERGE_PATCH, ApiException, Client

log = logging.getLogger(__name__)

COMPONENT = "fleet-controller-manager"
DEDUPE_WINDOW = 600.0
MAX_CACHED = 4096


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    first: float


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    md = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
           "name": md.get("name"), "uid": md.get("uid"),
           "resourceVersion": md.get("resourceVersion")}
    if md.get("namespace"):
        ref["namespace"] = md["namespace"]
    return ref


class EventRecorder:
    def __init__(self, client: Client, component: str = COMPONENT, *,
                 queue_size: int = 2000, senders: int = 2,
                 dedupe_window: float = DEDUPE_WINDOW) -> None:
        self.client = client
        self.component = component
        self.senders = senders
        self.dedupe_window = dedupe_window
        self.dropped = 0
        self._seen: OrderedDict[tuple[str, str, str, str], _Seen] = OrderedDict()
        self._send, self._recv = trio.open_memory_channel[tuple[Any, ...]](queue_size)
        self._running = False

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue one event about `obj` (never blocks, never raises)."""
        try:
            self._send.send_nowait((obj, type_, reason, message))
        except trio.WouldBlock:
            self.dropped += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            for _ in range(self.senders):
                n.start_soon(self._sender)
            self._running = True
            task_status.started()

    async def _sender(self) -> None:
        async for obj, type_, reason, message in self._recv:
            try:
                await self.write(obj, type_, reason, message)
            except Exception as e:  # noqa: BLE001 - events must never stop a controller
                log.info("event %s for %s not written: %r", reason,
                         (obj.get("metadata") or {}).get("name"), e)

    async def write(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        md = obj.get("metadata") or {}
        namespace = md.get("namespace") or "default"
        key = (str(md.get("uid") or md.get("name")), type_, reason, message)
        now = trio.current_time()
        seen = self._seen.get(key)
        if seen is not None and now - seen.first <= self.dedupe_window:
            try:
                await self.client.patch("v1", "events", seen.name,
                                        {"count": seen.count + 1, "lastTimestamp": _now()},
                                        MERGE_PATCH, seen.namespace)
                seen.count += 1
                return
            except ApiException as e:
                if e.code != 404:
                    raise
        name = f"{md.get('name')}.{secrets.token_hex(8)}"
        ts = _now()
        await self.client.create("v1", "events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved(obj), "reason": reason, "message": message,
            "type": type_, "source": {"component": self.component},
            "reportingComponent": self.component, "reportingInstance": self.component,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }, namespace)
        self._seen[key] = _Seen(name, namespace, 1, now)
        while len(self._seen) > MAX_CACHED:
            self._seen.popitem(last=False)
