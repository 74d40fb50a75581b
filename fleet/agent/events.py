"""Kubernetes Events for pod lifecycle steps, written as the kubelet writes them.

`EventRecorder.record` creates a v1 Event in the pod's namespace (involvedObject =
the pod, optionally a container's `spec.containers{name}` fieldPath), so
`kubectl describe pod` and `kubectl get events` show what the node did.

* De-duplication: the same (pod uid, reason, message, fieldPath) within
  `DEDUPE_WINDOW` seconds bumps `count` and `lastTimestamp` of the event already
  written (a merge PATCH) instead of creating another one, like client-go's
  EventCorrelator.  A bump of an event that is gone (expired) creates a new one.
* Rate limit: a token bucket per pod — `burst` events at once, then one every
  `refill_seconds` — so a crash loop cannot flood the API; dropped events are logged.
* Asynchronous when `run` is serving: `record` queues and returns; a few sender tasks
  write, each pod's events in order.
* Never raises: an API error (or a slow API, bounded by `timeout`) is logged and the
  event dropped; events must never break the pod worker.

Times for the dedupe window and the rate limit are on Trio's clock.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio

from fleet.client import MERGE_PATCH, ApiException

log = logging.getLogger(__name__)

DEDUPE_WINDOW = 600.0
BURST = 25
REFILL_SECONDS = 5.0
MAX_CACHED = 4096
TIMEOUT = 10.0
QUEUE_SIZE = 2048  # events waiting for a sender; beyond it they are dropped (and logged)

NORMAL = "Normal"
WARNING = "Warning"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def container_field_path(name: str, *, init: bool = False) -> str:
    return f"spec.{'initContainers' if init else 'containers'}{{{name}}}"


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    first: float  # Trio time of the first occurrence in this window


@dataclass
class _Bucket:
    tokens: float
    at: float


class EventRecorder:
    """Writes v1 Events for pods on behalf of `component` on node `node_name`."""

    def __init__(self, client: Any, node_name: str, component: str = "kubelet", *,
                 burst: int = BURST, refill_seconds: float = REFILL_SECONDS,
                 dedupe_window: float = DEDUPE_WINDOW, timeout: float = TIMEOUT) -> None:
        self.client = client
        self.node_name = node_name
        self.component = component
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.dedupe_window = dedupe_window
        self.timeout = timeout
        self._seen: OrderedDict[tuple[str, str, str, str], _Seen] = OrderedDict()
        self._buckets: dict[str, _Bucket] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._queue: trio.MemorySendChannel[tuple[Any, ...]] | None = None

    def forget(self, uid: str) -> None:
        """Drop what is kept for a pod (its worker is gone)."""
        self._buckets.pop(uid, None)
        self._locks.pop(uid, None)
        for key in [k for k in self._seen if k[0] == uid]:
            del self._seen[key]

    def _allow(self, uid: str) -> bool:
        now = trio.current_time()
        b = self._buckets.get(uid)
        if b is None:
            b = self._buckets[uid] = _Bucket(float(self.burst), now)
        if self.refill_seconds > 0:
            b.tokens = min(float(self.burst), b.tokens + (now - b.at) / self.refill_seconds)
        b.at = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    async def run(self, *, workers: int = 4,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send events in the background until cancelled.

        While this runs, `record` only queues the event and returns at once, so a pod
        worker never waits on the API for an event (the kubelet's event broadcaster is
        asynchronous the same way; a pod start used to spend ~10 ms writing its
        Created/Started events before its status).  A pod's events are still written
        in order: a sender takes the pod's lock before it can yield, and Trio's locks
        are fair.  Without this service `record` writes synchronously."""
        send, recv = trio.open_memory_channel[tuple[Any, ...]](QUEUE_SIZE)
        async with trio.open_nursery() as n, recv:
            for _ in range(workers):
                n.start_soon(self._sender, recv.clone())
            self._queue = send
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._queue = None

    async def _sender(self, recv: trio.MemoryReceiveChannel[tuple[Any, ...]]) -> None:
        async with recv:
            async for item in recv:
                await self._deliver(*item)

    async def record(self, pod: dict[str, Any], type_: str, reason: str, message: str,
                     field_path: str | None = None) -> None:
        """Write (or bump) one event about `pod` — or queue it, see `run`; never raises."""
        md = pod.get("metadata") or {}
        uid = str(md.get("uid") or "")
        if not self._allow(uid):
            log.info("event dropped (rate limit) for pod %s/%s: %s %s",
                     md.get("namespace"), md.get("name"), reason, message)
            return
        if self._queue is not None:
            try:
                self._queue.send_nowait((pod, type_, reason, message, field_path))
                return
            except trio.WouldBlock:
                log.warning("event dropped (queue full) for pod %s/%s: %s %s",
                            md.get("namespace"), md.get("name"), reason, message)
                return
            except trio.ClosedResourceError:
                pass
        await self._deliver(pod, type_, reason, message, field_path)

    async def _deliver(self, pod: dict[str, Any], type_: str, reason: str, message: str,
                       field_path: str | None) -> None:
        md = pod.get("metadata") or {}
        uid = str(md.get("uid") or "")
        try:
            lock = self._locks.setdefault(uid, trio.Lock())
            with trio.move_on_after(self.timeout) as scope:
                async with lock:
                    await self._write(pod, type_, reason, message, field_path)
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(uid, None)
            if scope.cancelled_caught:
                log.warning("event for pod %s/%s timed out: %s %s", md.get("namespace"),
                            md.get("name"), reason, message)
        except Exception as e:  # noqa: BLE001 - events must never break the worker
            log.warning("cannot record event %s for pod %s: %s", reason, md.get("name"), e)

    async def _write(self, pod: dict[str, Any], type_: str, reason: str, message: str,
                     field_path: str | None) -> None:
        md = pod.get("metadata") or {}
        uid = str(md.get("uid") or "")
        namespace = md.get("namespace") or "default"
        key = (uid, reason, message, field_path or "")
        now = trio.current_time()
        seen = self._seen.get(key)
        if seen is not None and now - seen.first <= self.dedupe_window:
            try:
                await self.client.patch(
                    "v1", "events", seen.name,
                    {"count": seen.count + 1, "lastTimestamp": _now()},
                    MERGE_PATCH, namespace=seen.namespace)
                seen.count += 1
                self._seen.move_to_end(key)
                return
            except ApiException as e:
                if e.code != 404:
                    raise
                # The event expired meanwhile: write a new one.
        ts = _now()
        name = f"{md.get('name')}.{secrets.token_hex(8)}"
        involved: dict[str, Any] = {"kind": "Pod", "namespace": namespace,
                                    "name": md.get("name"), "uid": uid, "apiVersion": "v1"}
        if md.get("resourceVersion"):
            involved["resourceVersion"] = md["resourceVersion"]
        if field_path:
            involved["fieldPath"] = field_path
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason, "message": message, "type": type_,
            "source": {"component": self.component, "host": self.node_name},
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.node_name,
        }
        await self.client.create("v1", "events", body, namespace)
        self._seen[key] = _Seen(name, namespace, 1, now)
        self._seen.move_to_end(key)
        while len(self._seen) > MAX_CACHED:
            self._seen.popitem(last=False)


__all__ = ["NORMAL", "WARNING", "EventRecorder", "container_field_path"]
