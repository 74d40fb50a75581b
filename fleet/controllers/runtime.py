"""The controller runtime: work queues, expectations, the manager (informers: fleet.client).

    API ──list+watch──▶ SharedInformer (cache + indexes) ──handlers──▶ enqueue(key)
                                                                         │
                              WorkQueue (de-duplicating, rate-limited) ◀─┘
                                         │ get()
                                         ▼
                          Controller.reconcile(key) — reads the caches, decides with a
                          pure plan(desired, observed), writes through the client

* **SharedInformer** — `fleet.client.informer.Informer`, the one informer every role
  uses: one list+watch per resource however many controllers use it (the
  `InformerFactory` hands out the same one), re-listing after a 410 or a lost
  connection.  The cache is keyed "ns/name"; named indexes (by owner uid, by node,
  ...) answer "which objects does X own" without a scan.  This module adds the index
  functions controllers share (`by_controller_uid`, `by_owner_uid`, `by_node_name`).
* **WorkQueue** — a key is queued at most once; a key added while it is being
  reconciled is queued again when that reconcile is done, so two workers never
  reconcile one key at once and no change is lost.  `add_rate_limited` backs off
  per key (5 ms doubling to 1000 s, as client-go's default controller rate limiter);
  `forget` resets it after a success; `add_after` schedules a later look (a Deployment's
  progress deadline, a CronJob's next run).  A reconcile that raises is logged,
  counted and re-queued rate-limited, so a poisoned object is retried ever more
  rarely while the controller carries on with every other key.
* **Expectations** — a controller that created 3 pods must not create 3 more before
  its informer has seen the first 3 (client-go's ControllerExpectations).  It records
  what it expects; informer events lower the counts; until they reach zero (or 5
  minutes pass) reconcile does not act on counts.
* **Claiming** — `claim_owned` is ControllerRefManager's claim with its writes
  (adopt matching orphans, release what no longer matches, each JSON patch
  guarded by uid and resourceVersion) over an informer `index_claimable` indexed;
  `controller_key` maps an owned object's event to its owner's key.  The
  DaemonSet and StatefulSet controllers claim their pods and ControllerRevisions
  with it (the ReplicaSet controller writes pods through its own `PodWriter`).
* **Manager** — runs every controller in one nursery with one client and one
  informer factory; the whole manager is one task, ready to be started only while
  holding a leader lease once there are several servers.

Times come from `trio.current_time()`, so tests drive queues and expectations with
MockClock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import trio

from fleet._core.supervise import object_failed, supervise
from fleet.api import owners
from fleet.api.owners import controller_of
from fleet.client import JSON_PATCH, ApiException, Client, ClientConfig

# The informer lives in fleet.client (every role uses it); controllers import it from here too.
from fleet.client.informer import InformerFactory as InformerFactory
from fleet.client.informer import SharedInformer as SharedInformer
from fleet.client.informer import by_namespace as by_namespace
from fleet.client.informer import object_key

log = logging.getLogger(__name__)


def key_of(obj: dict[str, Any]) -> str:
    """"namespace/name" (or "/name" for cluster-scoped objects), the cache and queue key."""
    return object_key(obj)


def split_key(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return ns, name


def by_controller_uid(obj: dict[str, Any]) -> list[str]:
    """Index: the uid of the object's controller (Deployments find their ReplicaSets...)."""
    ref = controller_of(obj)
    return [str(ref.get("uid"))] if ref and ref.get("uid") else []


def by_owner_uid(obj: dict[str, Any]) -> list[str]:
    """Index: the uid of every owner (the garbage collector's dependents lookup)."""
    return [str(r["uid"]) for r in (obj.get("metadata") or {}).get("ownerReferences") or []
            if isinstance(r, dict) and r.get("uid")]


def by_node_name(obj: dict[str, Any]) -> list[str]:
    node = (obj.get("spec") or {}).get("nodeName")
    return [str(node)] if node else []


def namespace_terminating(e: ApiException) -> bool:
    """errors.HasStatusCause(err, NamespaceTerminatingCause): a create refused because
    its namespace is being deleted — nothing to retry."""
    return any(c.get("reason") == "NamespaceTerminating"
               for c in e.details.get("causes") or [] if isinstance(c, dict))


# ---------------------------------------------------------------------------------------
# Claiming owned objects (the DaemonSet and StatefulSet controllers' pods and revisions)

OWNED_INDEX = "controller"  # by_controller_uid
ORPHAN_INDEX = "orphan-namespace"  # owners.orphan_namespace


def index_claimable(informer: SharedInformer) -> None:
    """The two indexes `claim_owned` reads: objects by their controller's uid, and
    controller-less objects by namespace (the orphans an owner may adopt)."""
    informer.add_index(OWNED_INDEX, by_controller_uid)
    informer.add_index(ORPHAN_INDEX, owners.orphan_namespace)


def controller_key(obj: Mapping[str, Any] | None, api_version: str, kind: str) -> str | None:
    """The queue key of the `api_version`/`kind` object controlling `obj` (None: no such
    controller) — how a pod's or a revision's event finds the workload to reconcile."""
    if obj is None:
        return None
    ref = controller_of(obj)
    if ref is None or ref.get("kind") != kind or ref.get("apiVersion") != api_version:
        return None
    return f"{(obj.get('metadata') or {}).get('namespace') or ''}/{ref.get('name')}"


async def claim_owned(client: Client, informer: SharedInformer, owner: dict[str, Any], ns: str,
                      matches: Callable[[dict[str, Any]], bool], *, api_version: str, kind: str,
                      resource: tuple[str, str], release: bool = True) -> list[dict[str, Any]]:
    """ControllerRefManager's claim, written: `owner`'s objects of `informer` (one
    indexed by `index_claimable`) after adopting the orphans `matches` accepts and —
    when `release` — releasing owned ones it no longer accepts.  `resource` is the
    (apiVersion, plural) the patches go to.  Each patch is guarded by the uid and
    resourceVersion it was computed from; one that finds the object gone or changed
    is skipped (the informer's event brings a fresh pass)."""
    res_version, plural = resource
    uid = str((owner.get("metadata") or {}).get("uid") or "")
    candidates = {str((o.get("metadata") or {}).get("uid") or ""): o
                  for o in informer.by_index(OWNED_INDEX, uid)}
    for o in informer.by_index(ORPHAN_INDEX, ns):
        candidates.setdefault(str((o.get("metadata") or {}).get("uid") or ""), o)
    owned, adopt, to_release = owners.claim(owner, candidates.values(), matches)
    for obj in adopt:
        ops = owners.adopt_patch(obj, owner, api_version=api_version, kind=kind)
        try:
            owned.append(await client.patch(res_version, plural, _name(obj), ops, JSON_PATCH, ns))
        except ApiException as e:
            if e.code not in (404, 409, 422):  # gone, or not the copy we saw: the next pass re-reads
                raise
    for obj in to_release if release else ():
        try:
            await client.patch(res_version, plural, _name(obj), owners.release_patch(obj, owner),
                               JSON_PATCH, ns)
        except ApiException as e:
            if e.code not in (404, 409, 422):  # gone, or not the copy we saw: the next pass re-reads
                raise
    return owned


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


# ---------------------------------------------------------------------------------------
# Work queue


@dataclass
class _Item:
    failures: int = 0


class QueueMetrics:
    """What client-go's workqueue metrics tell: adds, retries, how long keys wait in
    the queue (add → get) and how long their reconcile takes.  The latest `keep`
    samples of each are kept for percentiles; counts are totals since start."""

    def __init__(self, keep: int = 65536) -> None:
        self.adds = 0
        self.processed = 0
        self.retries = 0
        self.queue_latency: deque[float] = deque(maxlen=keep)
        self.work_duration: deque[float] = deque(maxlen=keep)

    @staticmethod
    def _percentiles(samples: Iterable[float]) -> dict[str, float | None]:
        xs = sorted(samples)
        if not xs:
            return {"p50": None, "p99": None, "max": None}

        def at(q: float) -> float:
            return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]

        return {"p50": at(0.50), "p99": at(0.99), "max": xs[-1]}

    def snapshot(self) -> dict[str, Any]:
        return {"adds": self.adds, "processed": self.processed, "retries": self.retries,
                "queue_latency_s": self._percentiles(self.queue_latency),
                "work_duration_s": self._percentiles(self.work_duration)}


_QUEUES: weakref.WeakSet[WorkQueue] = weakref.WeakSet()


def queue_stats() -> dict[str, dict[str, Any]]:
    """Every live work queue's metrics by name (benchmarks and debugging read this)."""
    out: dict[str, dict[str, Any]] = {}
    for q in list(_QUEUES):
        name = q.name or f"queue-{id(q):x}"
        out[name] = {**q.metrics.snapshot(), "depth": len(q)}
    return out


class WorkQueue:
    """De-duplicating, rate-limited work queue of keys (client-go's workqueue)."""

    def __init__(self, *, base_delay: float = 0.005, max_delay: float = 1000.0,
                 name: str = "") -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.name = name
        self.metrics = QueueMetrics()
        self._added_at: dict[str, float] = {}  # when each queued key was first added
        _QUEUES.add(self)
        self._queue: list[str] = []
        self._head = 0
        self._dirty: set[str] = set()  # queued (or to be re-queued when done)
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._later: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._wakeup = trio.Event()
        self.shutting_down = False

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: str) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        self.metrics.adds += 1
        self._added_at.setdefault(key, trio.current_time())
        if key not in self._processing:
            self._queue.append(key)
            self._wakeup.set()

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        heapq.heappush(self._later, (trio.current_time() + delay, next(self._seq), key))
        self._wakeup.set()

    def add_rate_limited(self, key: str) -> None:
        self.metrics.retries += 1
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        self.add_after(key, min(self.base_delay * (2 ** n), self.max_delay))

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> str:
        while True:
            now = trio.current_time()
            while self._later and self._later[0][0] <= now:
                _, _, key = heapq.heappop(self._later)
                self.add(key)
            if self._head < len(self._queue):
                key = self._queue[self._head]
                self._head += 1
                if self._head > 1024 and self._head * 2 > len(self._queue):
                    del self._queue[:self._head]
                    self._head = 0
                self._dirty.discard(key)
                self._processing.add(key)
                added = self._added_at.pop(key, None)
                if added is not None:
                    self.metrics.queue_latency.append(now - added)
                return key
            deadline = self._later[0][0] if self._later else math.inf
            if self._wakeup.is_set():
                self._wakeup = trio.Event()
            with trio.move_on_at(deadline):
                await self._wakeup.wait()

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:  # changed while being reconciled: look again
            self._queue.append(key)
            self._wakeup.set()


# ---------------------------------------------------------------------------------------
# Expectations


@dataclass
class _Expect:
    add: int = 0
    delete: set[str] = field(default_factory=set)
    at: float = 0.0


class Expectations:
    """What a controller's own writes should soon show up as in its informer.

    `satisfied(key)` is False while creations or deletions are outstanding, unless
    `ttl` has passed since they were recorded (a lost watch event must not wedge a
    controller forever; client-go uses 5 minutes)."""

    def __init__(self, ttl: float = 300.0) -> None:
        self.ttl = ttl
        self._e: dict[str, _Expect] = {}

    def expect_creations(self, key: str, n: int) -> None:
        e = self._e.setdefault(key, _Expect())
        e.add += n
        e.at = trio.current_time()

    def expect_deletions(self, key: str, uids: Iterable[str]) -> None:
        e = self._e.setdefault(key, _Expect())
        e.delete.update(uids)
        e.at = trio.current_time()

    def creation_observed(self, key: str) -> None:
        e = self._e.get(key)
        if e is not None and e.add > 0:
            e.add -= 1

    def creation_failed(self, key: str) -> None:
        """A create the controller expected did not happen (the API refused it)."""
        self.creation_observed(key)

    def deletion_observed(self, key: str, uid: str) -> None:
        e = self._e.get(key)
        if e is not None:
            e.delete.discard(uid)

    def satisfied(self, key: str) -> bool:
        e = self._e.get(key)
        if e is None or (e.add <= 0 and not e.delete):
            return True
        return trio.current_time() - e.at > self.ttl

    def forget(self, key: str) -> None:
        self._e.pop(key, None)


# ---------------------------------------------------------------------------------------
# Controllers and the manager


class Controller(Protocol):
    """What the manager runs: `setup` asks for informers and wires handlers (before the
    informers start); `run` works until cancelled."""

    name: str

    def setup(self, ctx: Context) -> None: ...

    async def run(self, ctx: Context) -> None: ...


@dataclass
class Context:
    client: Client
    informers: InformerFactory
    events: Any = None  # fleet.client.events.EventRecorder, set by the manager


class QueueWorker:
    """The usual controller shape: a WorkQueue drained by `workers` tasks calling
    `reconcile(key)`.  An exception re-queues the key with back-off; a float return
    re-queues it after that many seconds; None forgets its failures."""

    name = "controller"
    workers = 2
    kind = ""  # what its keys name, for the error counts (e.g. "Deployment")

    def __init__(self) -> None:
        self.queue = WorkQueue(name=self.name)

    async def reconcile(self, key: str) -> float | None:
        raise NotImplementedError

    def enqueue(self, obj: dict[str, Any] | None) -> None:
        if obj is not None:
            self.queue.add(key_of(obj))

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            for _ in range(self.workers):
                n.start_soon(self._worker)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            started = trio.current_time()
            try:
                again = await self.reconcile(key)
            except Exception as e:  # noqa: BLE001 - keep the controller alive, retry later
                failures = self.queue.failures(key)
                # Counted every time, logged loudly only the first few: a poisoned
                # object is retried forever (ever more rarely, up to the queue's
                # max delay), and it must not drown the log.
                object_failed(self.name, self.kind or self.name, key, e, logger=log,
                              action=f"reconcile failed ({failures + 1}); retrying with back-off",
                              level=logging.WARNING if failures < 5 else logging.DEBUG)
                self.queue.add_rate_limited(key)
            else:
                if again is not None:
                    self.queue.add_after(key, again)
                else:
                    self.queue.forget(key)
            finally:
                self.queue.metrics.processed += 1
                self.queue.metrics.work_duration.append(trio.current_time() - started)
                self.queue.done(key)


class Manager:
    """Runs a set of controllers with one client and one informer factory."""

    def __init__(self, controllers: Iterable[Controller]) -> None:
        self.controllers = list(controllers)

    async def run(self, config: ClientConfig, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from fleet.client.events import EventRecorder

        async with Client(config, user_agent="fleet-controller-manager") as client:
            ctx = Context(client=client, informers=InformerFactory(client))
            ctx.events = EventRecorder(client, "fleet-controller-manager", queue_size=2000, senders=2)
            for c in self.controllers:
                c.setup(ctx)
            async with trio.open_nursery() as n:
                await n.start(ctx.informers.run)
                await n.start(ctx.events.run)
                for c in self.controllers:
                    # One controller crashing restarts only itself, with back-off.
                    n.start_soon(partial(supervise, f"controller/{c.name}", c.run, ctx,
                                         uses_task_status=False))
                task_status.started()
