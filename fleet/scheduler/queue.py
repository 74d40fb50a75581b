"""The scheduling queue: pending pods waiting for a scheduling cycle.

Three places a pod key can be (kube-scheduler's PriorityQueue):

- **active** — ready now; `pop()` serves the highest `spec.priority` first and
  FIFO among equals (kube-scheduler's default QueueSort, PrioritySort);
- **back-off** — failed recently (a bind error, or a cluster change arrived
  while it was unschedulable) and waits `initial_backoff * 2**(attempts-1)`,
  capped at `max_backoff`, before going active again;
- **unschedulable** — no node fits; it stays parked until a cluster event
  that could make it fit (`move_all`: a node added or changed, a pod
  deleted) or, as a safety net, `unschedulable_timeout` passes.  Without
  this a pod that fits nowhere would be retried in a busy loop.

Keys are "namespace/name"; the queue holds no pod objects, so the scheduler
always schedules the newest version it has cached.  Every operation is
O(log n) or better in the number of queued pods except `move_all`, which is
linear in the *parked* pods only — the benchmark queues 10,000 pods at once.
Every time comes from `trio.current_time()`, so tests drive the queue with
`MockClock`.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import trio

ACTIVE, BACKOFF, UNSCHEDULABLE, IN_FLIGHT = "active", "backoff", "unschedulable", "in-flight"


@dataclass
class _Entry:
    where: str
    priority: int = 0
    attempts: int = 0
    backoff_until: float = 0.0
    parked_at: float = 0.0
    seq: int = 0  # the active-heap row that is current (older rows are stale)


class SchedulingQueue:
    def __init__(self, *, initial_backoff: float = 1.0, max_backoff: float = 10.0,
                 unschedulable_timeout: float = 300.0) -> None:
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.unschedulable_timeout = unschedulable_timeout
        self._entries: dict[str, _Entry] = {}
        self._active: list[tuple[int, int, str]] = []  # (-priority, seq, key); stale rows skipped
        self._backoff: list[tuple[float, int, str]] = []  # (ready_at, seq, key); stale rows skipped
        # Parked pods in the order they were parked (= parked_at order): the oldest
        # is first, so the safety-net timeout only ever looks at the front.
        self._parked: dict[str, float] = {}
        self._seq = itertools.count()
        self._wakeup = trio.Event()

    # -- what the informers and the loop call -------------------------------
    def add(self, key: str, priority: int = 0) -> None:
        """A pending pod appeared or changed: make sure it will be (re)considered."""
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry(ACTIVE, priority=priority)
            self._push_active(key, e)
            return
        if e.priority != priority:
            e.priority = priority
            if e.where == ACTIVE:
                self._push_active(key, e)  # re-sorted; the old row goes stale
        if e.where == UNSCHEDULABLE:
            # The pod itself changed (new selector, smaller requests): try again.
            self._reactivate(key, e)

    def delete(self, key: str) -> None:
        """The pod is gone or bound: forget it (stale heap rows are skipped)."""
        self._entries.pop(key, None)
        self._parked.pop(key, None)

    def done(self, key: str) -> None:
        """The pod was bound."""
        self.delete(key)

    def add_unschedulable(self, key: str) -> None:
        """No node fits: park the pod until the cluster changes."""
        e = self._entries.get(key)
        if e is None:
            return  # deleted while being scheduled
        e.attempts += 1
        now = trio.current_time()
        e.backoff_until = now + self._backoff_for(e.attempts)
        e.where = UNSCHEDULABLE
        e.parked_at = now
        self._parked.pop(key, None)
        self._parked[key] = now
        self._wakeup.set()  # pop() must learn the new unschedulable deadline

    def add_backoff(self, key: str) -> None:
        """Scheduling failed for a transient reason (a bind error): retry after back-off."""
        e = self._entries.get(key)
        if e is None:
            return
        e.attempts += 1
        self._to_backoff(key, e, trio.current_time() + self._backoff_for(e.attempts))

    def move_all(self) -> None:
        """A cluster event that may make parked pods fit: move them on.

        A pod still inside its back-off window goes to back-off, not active,
        so a flapping node cannot turn the scheduler into a busy loop.
        """
        parked, self._parked = self._parked, {}
        for key in parked:
            e = self._entries.get(key)
            if e is not None and e.where == UNSCHEDULABLE:
                self._reactivate(key, e)

    async def pop(self) -> str:
        """The next pod key to schedule; waits until one is ready."""
        while True:
            now = trio.current_time()
            self._flush(now)
            while self._active:
                _, seq, key = heapq.heappop(self._active)
                e = self._entries.get(key)
                if e is not None and e.where == ACTIVE and e.seq == seq:
                    e.where = IN_FLIGHT
                    return key
            deadline = self._next_deadline()
            if self._wakeup.is_set():
                self._wakeup = trio.Event()
            with trio.move_on_at(deadline):
                await self._wakeup.wait()

    # -- introspection (tests, metrics) ---------------------------------------
    def where(self, key: str) -> str | None:
        e = self._entries.get(key)
        return e.where if e else None

    def __len__(self) -> int:
        return len(self._entries)

    def counts(self) -> dict[str, int]:
        """Pods per sub-queue (for metrics; linear, so not on the hot path)."""
        out = {ACTIVE: 0, BACKOFF: 0, UNSCHEDULABLE: 0, IN_FLIGHT: 0}
        for e in self._entries.values():
            out[e.where] += 1
        return out

    # -- internals ---------------------------------------------------------------
    def _backoff_for(self, attempts: int) -> float:
        return min(self.initial_backoff * (2 ** max(attempts - 1, 0)), self.max_backoff)

    def _push_active(self, key: str, e: _Entry) -> None:
        e.where = ACTIVE
        e.seq = next(self._seq)
        heapq.heappush(self._active, (-e.priority, e.seq, key))
        self._wakeup.set()

    def _reactivate(self, key: str, e: _Entry) -> None:
        self._parked.pop(key, None)
        if e.backoff_until > trio.current_time():
            self._to_backoff(key, e, e.backoff_until)
        else:
            self._push_active(key, e)

    def _to_backoff(self, key: str, e: _Entry, until: float) -> None:
        self._parked.pop(key, None)
        e.where = BACKOFF
        e.backoff_until = until
        heapq.heappush(self._backoff, (until, next(self._seq), key))
        self._wakeup.set()

    def _flush(self, now: float) -> None:
        while self._backoff and self._backoff[0][0] <= now:
            until, _, key = heapq.heappop(self._backoff)
            e = self._entries.get(key)
            if e is not None and e.where == BACKOFF and e.backoff_until == until:
                self._push_active(key, e)
        while self._parked:
            key, parked_at = next(iter(self._parked.items()))
            if now - parked_at < self.unschedulable_timeout:
                break
            del self._parked[key]
            e = self._entries.get(key)
            if e is not None and e.where == UNSCHEDULABLE:
                self._push_active(key, e)

    def _next_deadline(self) -> float:
        deadline = float("inf")
        while self._backoff:
            until, _, key = self._backoff[0]
            e = self._entries.get(key)
            if e is not None and e.where == BACKOFF and e.backoff_until == until:
                deadline = until
                break
            heapq.heappop(self._backoff)  # stale row
        if self._parked:
            deadline = min(deadline, next(iter(self._parked.values())) + self.unschedulable_timeout)
        return deadline
