"""The one event recorder: v1 Events about any object, as client-go's recorder writes them.

Every role reports what it did as Events (`kubectl describe`, `kubectl get
events`): the agent about pods (Pulling, Started, BackOff...), the controllers
about their objects (SuccessfulCreate, ScalingReplicaSet...), the scheduler
(Scheduled, FailedScheduling, Preempted).  They share this recorder:

* `record(obj, type, reason, message, field_path=None)` never blocks and never
  raises: the event is queued for background senders.  The work an event
  describes matters more than the event.
* Correlation, as client-go's EventCorrelator: the same (object, type, reason,
  message, fieldPath) within `dedupe_window` bumps `count` and `lastTimestamp`
  of the event already written (a merge PATCH) instead of creating another; a
  bump of an event that is gone (expired) writes a new one.
* Aggregation, as client-go's EventAggregator: once more than
  `aggregate_after` different messages with the same (object, type, reason,
  fieldPath) arrive within the window, the rest are folded into one event
  whose message starts "(combined from similar events): ".
* A per-object rate limit (a token bucket: `burst` at once, then one every
  `refill_seconds`), so a crash loop or a hot controller cannot flood the API.
* Ordered per object: an object's waiting events form one FIFO that a single
  sender drains, so they are written in the order recorded, while different
  objects' go in parallel.
* Every event that is not written — rate-limited, queue full, timed out, or an
  API error — is counted in `fleet_events_dropped_total{component,why}` and
  logged.

Before `run` starts, events queue up (bounded) and are sent once it does;
`write_now` writes one synchronously.  Times are on Trio's clock.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import trio
from prometheus_client import Counter

from fleet._core.supervise import REGISTRY
from fleet.api.meta import now_rfc3339
from fleet.client import MERGE_PATCH, ApiException

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"

DEDUPE_WINDOW = 600.0
AGGREGATE_AFTER = 10  # client-go's maxSimilarEvents
BURST = 25
REFILL_SECONDS = 5.0
MAX_CACHED = 4096
TIMEOUT = 10.0
QUEUE_SIZE = 4096
COMBINED = "(combined from similar events): "

EVENTS_DROPPED = Counter("fleet_events_dropped", "Events not written, by component and why",
                         ["component", "why"], registry=REGISTRY)


def dropped(component: str, why: str) -> float:
    """How many events `component` dropped for `why` (tests and the closing notes)."""
    return REGISTRY.get_sample_value("fleet_events_dropped_total", {"component": component, "why": why}) or 0.0


def involved(obj: dict[str, Any], field_path: str | None = None) -> dict[str, Any]:
    """The involvedObject reference of an event about `obj`."""
    md = obj.get("metadata") or {}
    ref: dict[str, Any] = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                           "name": md.get("name"), "uid": md.get("uid")}
    if md.get("namespace"):
        ref["namespace"] = md["namespace"]
    if md.get("resourceVersion"):
        ref["resourceVersion"] = md["resourceVersion"]
    if field_path:
        ref["fieldPath"] = field_path
    return {k: v for k, v in ref.items() if v is not None}


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


@dataclass
class _Similar:
    messages: set[str]
    first: float


class EventRecorder:
    """Writes v1 Events on behalf of `component` (and `host`, for a node's agent)."""

    def __init__(self, client: Any, component: str, *, host: str | None = None,
                 burst: int = BURST, refill_seconds: float = REFILL_SECONDS,
                 dedupe_window: float = DEDUPE_WINDOW, aggregate_after: int = AGGREGATE_AFTER,
                 timeout: float = TIMEOUT, queue_size: int = QUEUE_SIZE, senders: int = 4,
                 sender_clients: list[Any] | None = None) -> None:
        self.client = client
        # Sender i writes through sender_clients[i % n] when given (the scheduler
        # gives each sender its own connection, so events never queue behind binds).
        self._sender_clients = list(sender_clients or [])
        self.component = component
        self.host = host
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.dedupe_window = dedupe_window
        self.aggregate_after = aggregate_after
        self.timeout = timeout
        self.senders = senders
        self.running = False
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._similar: OrderedDict[tuple[str, ...], _Similar] = OrderedDict()
        self._buckets: dict[str, _Bucket] = {}
        # Per object, the events waiting in order; the channel carries an object's uid
        # once while it has any, so one sender drains one object's events in order
        # and different objects' go in parallel.
        self.queue_size = queue_size
        self._pending: dict[str, deque[tuple[Any, ...]]] = {}
        self._queued = 0
        self._send, self._recv = trio.open_memory_channel[str](queue_size)

    @property
    def dropped(self) -> int:
        """Events this recorder's component dropped, for any reason."""
        return int(sum(dropped(self.component, why) for why in ("rate_limit", "queue_full", "timeout", "error")))

    def _drop(self, why: str, obj: dict[str, Any], reason: str, message: str) -> None:
        EVENTS_DROPPED.labels(self.component, why).inc()
        md = _md(obj)
        log.info("%s: event %s for %s/%s dropped (%s): %s", self.component, reason, md.get("namespace"),
                 md.get("name"), why, message)

    def forget(self, uid: str) -> None:
        """Drop what is kept for an object that is gone."""
        self._buckets.pop(uid, None)
        for cache in (self._seen, self._similar):
            for key in [k for k in cache if k[0] == uid]:
                del cache[key]

    def _allow(self, uid: str) -> bool:
        now = trio.current_time()
        b = self._buckets.get(uid)
        if b is None:
            b = self._buckets[uid] = _Bucket(float(self.burst), now)
            while len(self._buckets) > MAX_CACHED:
                self._buckets.pop(next(iter(self._buckets)))
        if self.refill_seconds > 0:
            b.tokens = min(float(self.burst), b.tokens + (now - b.at) / self.refill_seconds)
        b.at = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    # -- the callers' side --------------------------------------------------------------
    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str,
               field_path: str | None = None) -> None:
        """Queue one event about `obj`; never blocks, never raises."""
        try:
            uid = _uid(obj)
            if not self._allow(uid):
                self._drop("rate_limit", obj, reason, message)
                return
            if self._queued >= self.queue_size:
                self._drop("queue_full", obj, reason, message)
                return
            waiting = self._pending.get(uid)
            if waiting is None:
                # No sender has this object: hand it to one (room is certain, one
                # token per object with events waiting, at most queue_size of them).
                waiting = self._pending[uid] = deque()
                self._send.send_nowait(uid)
            waiting.append((obj, type_, reason, message, field_path))
            self._queued += 1
        except Exception:  # noqa: BLE001 - recording must never break the caller
            log.exception("%s: event %s not queued", self.component, reason)

    async def write_now(self, obj: dict[str, Any], type_: str, reason: str, message: str,
                        field_path: str | None = None) -> None:
        """Write one event now (rate limit, correlation and ordering apply); never raises."""
        if not self._allow(_uid(obj)):
            self._drop("rate_limit", obj, reason, message)
            return
        await self._deliver(obj, type_, reason, message, field_path)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send queued events until cancelled."""
        async with trio.open_nursery() as n:
            for i in range(self.senders):
                c = self._sender_clients[i % len(self._sender_clients)] if self._sender_clients else self.client
                n.start_soon(self._sender, c)
            self.running = True
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self.running = False

    async def _sender(self, client: Any) -> None:
        async for uid in self._recv.clone():
            waiting = self._pending.get(uid)
            try:
                while waiting:
                    item = waiting.popleft()
                    self._queued -= 1
                    await self._deliver(*item, client=client)
            finally:
                if waiting:
                    # Cancelled mid-drain (a restart): the rest waits for the next sender.
                    self._send.send_nowait(uid)
                else:
                    self._pending.pop(uid, None)

    async def _deliver(self, obj: dict[str, Any], type_: str, reason: str, message: str,
                       field_path: str | None, *, client: Any = None) -> None:
        try:
            with trio.move_on_after(self.timeout) as scope:
                await self._write(client or self.client, obj, type_, reason, message, field_path)
            if scope.cancelled_caught:
                self._drop("timeout", obj, reason, message)
        except Exception as e:  # noqa: BLE001 - events must never stop their writer
            EVENTS_DROPPED.labels(self.component, "error").inc()
            md = _md(obj)
            log.info("%s: event %s for %s/%s not written: %r", self.component, reason,
                     md.get("namespace"), md.get("name"), e)

    # -- correlation, aggregation and the write ----------------------------------------------
    def _aggregate(self, uid: str, type_: str, reason: str, message: str, field_path: str) -> str:
        """The message to write: the original, or the combined form once similar events pile up."""
        now = trio.current_time()
        key = (uid, type_, reason, field_path)
        sim = self._similar.get(key)
        if sim is None or now - sim.first > self.dedupe_window:
            sim = self._similar[key] = _Similar(set(), now)
            while len(self._similar) > MAX_CACHED:
                self._similar.popitem(last=False)
        sim.messages.add(message)
        if len(sim.messages) > self.aggregate_after:
            return COMBINED + message
        return message

    async def _write(self, client: Any, obj: dict[str, Any], type_: str, reason: str, message: str,
                     field_path: str | None) -> None:
        md = _md(obj)
        uid = _uid(obj)
        namespace = md.get("namespace") or "default"
        message = self._aggregate(uid, type_, reason, message, field_path or "")
        # Combined events correlate on (object, type, reason): they are one event.
        key = (uid, type_, reason, field_path or "",
               "" if message.startswith(COMBINED) else message)
        now = trio.current_time()
        seen = self._seen.get(key)
        if seen is not None and now - seen.first <= self.dedupe_window:
            try:
                patch: dict[str, Any] = {"count": seen.count + 1, "lastTimestamp": now_rfc3339()}
                if message.startswith(COMBINED):
                    patch["message"] = message
                await client.patch("v1", "events", seen.name, patch, MERGE_PATCH, namespace=seen.namespace)
                seen.count += 1
                self._seen.move_to_end(key)
                return
            except ApiException as e:
                if e.code != 404:
                    raise
                # The event expired meanwhile: write a new one.
        ts = now_rfc3339()
        name = f"{md.get('name')}.{secrets.token_hex(8)}"
        source: dict[str, Any] = {"component": self.component}
        if self.host:
            source["host"] = self.host
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved(obj, field_path),
            "reason": reason, "message": message, "type": type_, "source": source,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.host or self.component,
        }
        await client.create("v1", "events", body, namespace)
        self._seen[key] = _Seen(name, namespace, 1, now)
        self._seen.move_to_end(key)
        while len(self._seen) > MAX_CACHED:
            self._seen.popitem(last=False)


def _md(obj: Any) -> dict[str, Any]:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return md if isinstance(md, dict) else {}


def _uid(obj: Any) -> str:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(md, dict):
        return ""
    return str(md.get("uid") or f"{md.get('namespace') or ''}/{md.get('name') or ''}")


__all__ = ["COMBINED", "NORMAL", "WARNING", "EventRecorder", "container_field_path", "dropped", "involved"]
