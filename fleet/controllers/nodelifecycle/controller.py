"""The node lifecycle controller's I/O: informer handlers in, node and pod writes out.

`NodeLifecycleController` keeps what the informers showed (nodes, node Leases, pods
bound to nodes) and runs four loops (`run_loops`): the monitor (one pass judges every
node with `health.plan_node`, the zones with `zones.plan_disruption`, and writes
conditions and taints from `taints.plan_taints`), the tainter (per-zone token buckets
drain the NoExecute queue), the evictor (deletes each pod when
`eviction.eviction_deadline` says so) and the pod GC of pods whose node is gone.
Every decision is one of those pure functions; this module only remembers, schedules
and writes.  See the package docstring for the rules.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet._core.supervise import object_failed
from fleet.client import ApiException
from fleet.client.events import EventRecorder
from fleet.controllers.nodelifecycle.cluster import RETRYABLE, ClusterAPI, _EventSink
from fleet.controllers.nodelifecycle.common import (
    CONTROLLER_NO_EXECUTE,
    EXCLUDE_DISRUPTION_LABEL,
    LEASE_NAMESPACE,
    NO_EXECUTE,
    NODE_CONTROLLER,
    TAINT_EVICTION_CONTROLLER,
    NodeLifecycleConfig,
    _name,
    _rv,
    _rv_int,
    excluded_from_disruption,
    no_execute_taints,
    node_taints,
    parse_time,
    pod_key,
    pod_node,
    pod_tolerations,
    ready_status,
    rfc3339,
    zone_key,
)
from fleet.controllers.nodelifecycle.eviction import (
    eviction_deadline,
    pod_not_ready_patch,
)
from fleet.controllers.nodelifecycle.health import (
    NodeHealth,
    NodePlan,
    grace_period,
    observe_lease,
    observe_node,
    plan_node,
)
from fleet.controllers.nodelifecycle.taints import (
    plan_taints,
    with_no_execute,
)
from fleet.controllers.nodelifecycle.zones import (
    DisruptionPlan,
    TokenBucket,
    plan_disruption,
)

log = logging.getLogger(__name__)


@dataclass
class Eviction:
    node: str
    deadline: float  # trio time
    in_flight: bool = False


@dataclass
class Stats:
    """Counters for tests, logs and benchmarks."""

    marked_unknown: int = 0
    tainted: int = 0
    evicted: int = 0
    cancelled: int = 0
    orphans_deleted: int = 0
    pods_marked_not_ready: int = 0
    last_unknown_delay: dict[str, float] = field(default_factory=dict)  # node -> seconds silent when judged


class NodeLifecycleController:
    """The node lifecycle controller: informer handlers in, node/pod writes out.

    Handlers (`on_node`, `on_lease`, `on_pod`) are synchronous and only touch
    memory; the monitor, the tainter, the evictor and the event writer are
    tasks started by `run_loops`.  All writes go through `api` with the
    resourceVersion they were based on where overwriting would be wrong (node
    status, taints, pod Ready), so a heartbeat that lands between our read and
    our write wins.
    """

    def __init__(self, api: ClusterAPI, cfg: NodeLifecycleConfig | None = None, *,
                 wall: Callable[[], float] = time.time) -> None:
        self.api = api
        self.cfg = cfg or NodeLifecycleConfig()
        self.wall = wall
        self.nodes: dict[str, dict[str, Any]] = {}
        self.lease_renew: dict[str, str | None] = {}
        self.health: dict[str, NodeHealth] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.pods_by_node: dict[str, set[str]] = defaultdict(set)
        self.zone_states: dict[str, str] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.taint_queue: dict[str, dict[str, None]] = defaultdict(dict)  # zone -> ordered node names
        self.all_disrupted = False
        self.evictions: dict[str, Eviction] = {}
        self.orphan_since: dict[str, float] = {}
        self.stats = Stats()
        self._deleted: dict[str, str | None] = {}  # pod key -> uid we deleted (no second event)
        self._not_ready_done: dict[str, str | None] = {}  # pod key -> resourceVersion we patched
        self._taint_seen: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._unjudgeable: dict[str, str | None] = {}  # node -> resourceVersion that broke plan_node
        self._wake_monitor = trio.Event()
        self._wake_tainter = trio.Event()
        self._wake_evictor = trio.Event()
        self._evict_send, self._evict_recv = trio.open_memory_channel[str](math.inf)
        # One shared recorder per reporting component (node-controller and
        # taint-eviction-controller sign their events differently).
        self._sink = _EventSink(api)
        self._recorders = {c: EventRecorder(self._sink, c, queue_size=10000, senders=2)
                           for c in (NODE_CONTROLLER, TAINT_EVICTION_CONTROLLER)}
        self._write_limiter = trio.CapacityLimiter(max(1, self.cfg.write_concurrency))
        self._retry_at = math.inf

    # -- informer handlers (synchronous, in-memory only) ----------------------------
    def on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            assert old is not None
            name = _name(old)
            self.nodes.pop(name, None)
            self._unjudgeable.pop(name, None)
            self.health.pop(name, None)
            for q in self.taint_queue.values():
                q.pop(name, None)
            self._taint_seen = {k: v for k, v in self._taint_seen.items() if k[0] != name}
            for key in list(self.pods_by_node.get(name, ())):
                self._cancel(key, event=False)  # the pod GC takes them after the quarantine
            self._wake_monitor.set()
            return
        assert new is not None
        name = _name(new)
        self.nodes[name] = new
        before = self.health.get(name)
        was_stale, probe_before = (before.stale, before.probe) if before is not None else (False, None)
        h = self._keep_health(name, observe_node(before, new, trio.current_time(),
                                                 renew=self.lease_renew.get(name)))
        if old is None:
            for key in self.pods_by_node.get(name, ()):
                self.orphan_since.pop(key, None)
        if old is None or no_execute_taints(old) != no_execute_taints(new):
            self._evaluate_node(name)
        if old is None or _fingerprint(old) != _fingerprint(new) or (was_stale and h.probe != probe_before):
            self._wake_monitor.set()

    def _keep_health(self, name: str, observed: NodeHealth) -> NodeHealth:
        """Store an observation *into* the node's record: the monitor may be holding
        the record across an await, and its verdict (stale, judged) must not be lost."""
        h = self.health.get(name)
        if h is None:
            self.health[name] = observed
            return observed
        h.probe, h.heartbeat, h.renew = observed.probe, observed.heartbeat, observed.renew
        return h

    def on_lease(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        lease = new if new is not None else old
        assert lease is not None
        if (lease.get("metadata") or {}).get("namespace") != LEASE_NAMESPACE:
            return
        name = _name(lease)
        if etype == "DELETED":
            self.lease_renew.pop(name, None)
            return
        renew = (lease.get("spec") or {}).get("renewTime")
        self.lease_renew[name] = str(renew) if renew else None
        h = self.health.get(name)
        if h is None or not renew:
            return
        probe_before = h.probe
        self._keep_health(name, observe_lease(h, str(renew), trio.current_time()))
        if h.stale and h.probe != probe_before:
            self._wake_monitor.set()  # it is back: take the NoExecute taint off now

    def on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        assert pod is not None
        key = pod_key(pod)
        if etype == "DELETED":
            prev = self.pods.pop(key, None)
            if prev is not None:
                self._unindex(key, pod_node(prev))
            self._cancel(key, event=False)
            self.orphan_since.pop(key, None)
            self._deleted.pop(key, None)
            self._not_ready_done.pop(key, None)
            return
        assert new is not None
        node = pod_node(new)
        if not node:
            return
        prev = self.pods.get(key)
        self.pods[key] = new
        if prev is not None and pod_node(prev) != node:
            self._unindex(key, pod_node(prev))
        self.pods_by_node[node].add(key)
        if (prev is None or pod_node(prev) != node or pod_tolerations(prev) != pod_tolerations(new)
                or bool((prev.get("metadata") or {}).get("deletionTimestamp"))
                != bool((new.get("metadata") or {}).get("deletionTimestamp"))):
            self._evaluate(key)

    def _unindex(self, key: str, node: str) -> None:
        keys = self.pods_by_node.get(node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.pods_by_node[node]

    # -- taint eviction (the NoExecute taint manager) ----------------------------
    def _taint_since(self, node: str, taint: Mapping[str, Any]) -> float:
        """When `taint` was added, as precisely as we know (see the module docstring)."""
        key = (node, f"{taint.get('key')}:{taint.get('effect')}")
        added = taint.get("timeAdded")
        seen = self._taint_seen.get(key)
        if seen is None or seen[0] != added:
            seen = (added, self.wall())
            self._taint_seen[key] = seen
        parsed = parse_time(added)
        if parsed is None:
            return seen[1]
        if 0.0 <= seen[1] - parsed < 1.0:
            return seen[1]  # same second: our observation is the precise one
        return parsed

    def _effective_no_execute(self, name: str, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The NoExecute taints that count: ours only once we judged the node after starting
        (before that they are leftovers from before a restart, about to be reset)."""
        taints = no_execute_taints(node)
        h = self.health.get(name)
        if h is None or not h.judged:
            taints = [t for t in taints if t.get("key") not in CONTROLLER_NO_EXECUTE]
        return taints

    def _decide(self, key: str) -> tuple[str | None, float | None]:
        """(node, wall-clock eviction time) for a pod now; (None, None) when it stays."""
        pod = self.pods.get(key)
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return None, None
        if key in self._deleted and self._deleted[key] == (pod.get("metadata") or {}).get("uid"):
            return None, None
        name = pod_node(pod)
        node = self.nodes.get(name)
        if node is None:
            return None, None
        taints = self._effective_no_execute(name, node)
        if not taints:
            return None, None
        return name, eviction_deadline(pod_tolerations(pod), taints, lambda t: self._taint_since(name, t))

    def _evaluate(self, key: str) -> None:
        name, at = self._decide(key)
        if name is None or at is None:
            self._cancel(key, event=True)
            return
        existing = self.evictions.get(key)
        if existing is not None and existing.in_flight:
            return  # the worker decides again right before deleting
        deadline = trio.current_time() + max(0.0, at - self.wall())
        # (Trio's clock and the wall clock drift apart by microseconds: not a new decision.)
        if existing is None or abs(existing.deadline - deadline) > 0.01 or existing.node != name:
            self.evictions[key] = Eviction(name, deadline)
            self._wake_evictor.set()

    def _evaluate_node(self, name: str) -> None:
        for key in list(self.pods_by_node.get(name, ())):
            self._evaluate(key)

    def _cancel(self, key: str, *, event: bool) -> None:
        e = self.evictions.pop(key, None)
        if e is None or e.in_flight:
            return
        pod = self.pods.get(key)
        if event and pod is not None:
            self.stats.cancelled += 1
            self._emit(pod, "Normal", "TaintManagerEviction", f"Cancelling deletion of Pod {key}",
                       TAINT_EVICTION_CONTROLLER)

    # -- events ---------------------------------------------------------------------------
    def _emit(self, obj: dict[str, Any], etype: str, reason: str, message: str, component: str) -> None:
        if not obj.get("kind"):
            obj = {**obj, "apiVersion": "v1", "kind": "Pod"}
        self._recorders[component].record(obj, etype, reason, message)

    # -- the loops -----------------------------------------------------------------------
    async def run_loops(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Monitor, tainter, evictor and event writer, until cancelled (caches filled first).

        Run again after a crash (the manager supervises it) with the state the
        informer handlers kept: evictions a cancelled worker held are free again."""
        for ev in self.evictions.values():
            ev.in_flight = False
        async with trio.open_nursery() as nursery:
            for recorder in self._recorders.values():
                await nursery.start(recorder.run)
            for _ in range(max(1, self.cfg.eviction_workers)):
                nursery.start_soon(self._eviction_worker)
            nursery.start_soon(self._evictor)
            nursery.start_soon(self._tainter)
            await self.monitor_pass()
            nursery.start_soon(self._monitor)
            task_status.started()

    async def _monitor(self) -> None:
        while True:
            t0 = trio.current_time()
            next_at = await self.monitor_pass()
            # The pass made a fresh event at its start: anything that happened
            # during the pass has set it, and we go round again soon.
            wake = self._wake_monitor
            spent = trio.current_time() - t0
            if spent > 0:
                # A pass walks every node: never spend more than ~20% of the time in
                # passes.  With 5,000 nodes and heartbeats lagging on an overloaded
                # server, the next deadline was always due and back-to-back passes
                # took most of the server's CPU — worst exactly when it had none.
                await trio.sleep(4 * spent)
            next_at = min(next_at, trio.current_time() + self.cfg.monitor_period)
            with trio.move_on_at(next_at):
                await wake.wait()
                await trio.sleep(self.cfg.coalesce)  # one pass for a burst of events

    async def monitor_pass(self) -> float:
        """One pass over every node; returns when the next one is due (trio time)."""
        self._wake_monitor = trio.Event()
        self._retry_at = math.inf
        now = trio.current_time()
        stamp = rfc3339(self.wall())
        # Phase 1, no awaits: judge all nodes, then the zones — before any NoExecute
        # taint is queued, so the pass that finds *every* node silent taints none.
        zone_statuses: dict[str, list[str | None]] = defaultdict(list)
        judged: dict[str, tuple[dict[str, Any], NodePlan]] = {}
        for name, node in self.nodes.items():
            h = self.health.setdefault(name, NodeHealth(probe=now, renew=self.lease_renew.get(name)))
            try:
                plan = plan_node(node, h, now, stamp, self.cfg)
                zone = zone_key(node)
            except Exception as e:  # noqa: BLE001 - one malformed node must not stop the monitor
                self._skip_node(name, node, e)
                continue
            judged[name] = (node, plan)
            # A node still registering (no Ready yet, within its startup grace) says
            # nothing about the zone's health; counting it as down would have every
            # single-node server enter full disruption for a moment at each start.
            starting = plan.ready is None and not plan.stale
            if not excluded_from_disruption(node) and not starting:
                zone_statuses[zone].append(plan.ready)
        disruption = plan_disruption(zone_statuses, self.zone_states, self.cfg)
        self._apply_disruption(disruption, now)
        if disruption.exited or self.all_disrupted:
            # Judge again: leaving the mode reset every probe; inside it no NoExecute taint.
            judged = {n: (node, plan_node(node, self.health[n], now, stamp, self.cfg,
                                          all_disrupted=self.all_disrupted))
                      for n, (node, _) in judged.items()}

        # Phase 2: the writes, a few nodes at a time — only for nodes with something to do,
        # so a pass over thousands of healthy nodes costs no task, no write.
        async with trio.open_nursery() as nursery:
            for name, (node, plan) in judged.items():
                if self._needs_io(name, node, plan, stamp):
                    nursery.start_soon(self._reconcile_node, name, node, plan, now, stamp)
        next_at = min(await self._collect_orphans(now, stamp), self._retry_at)
        for name, node in self.nodes.items():
            h = self.health.get(name)
            if h is not None and not h.stale and name in judged:
                deadline = h.probe + grace_period(node, self.cfg)
                if deadline > now:  # a past one failed this pass: _retry_at covers it
                    next_at = min(next_at, deadline)
        return next_at

    def _skip_node(self, name: str, node: dict[str, Any], exc: Exception) -> None:
        """Leave a node the monitor cannot judge out of this pass; said once per
        version of it (a pass runs every few seconds), counted every time."""
        rv = _rv(node)
        quiet = self._unjudgeable.get(name) == rv
        self._unjudgeable[name] = rv
        object_failed("node-lifecycle", "Node", f"/{name}", exc, action="not judging it", logger=log,
                      level=logging.DEBUG if quiet else logging.WARNING)

    def _needs_io(self, name: str, node: dict[str, Any], plan: NodePlan, stamp: str) -> bool:
        h = self.health[name]
        if plan.conditions is not None or plan.stale or h.stale != plan.stale or not h.judged:
            return True
        tp = plan_taints(node, plan.no_execute, stamp)
        return tp.taints is not None or tp.queue_no_execute != (name in self.taint_queue.get(zone_key(node), {}))

    def _apply_disruption(self, plan: DisruptionPlan, now: float) -> None:
        if plan.entered:
            log.warning("node lifecycle: no node in any zone is Ready; entering full disruption mode "
                        "(no NoExecute taints, no evictions until some node is Ready)")
            for q in self.taint_queue.values():
                q.clear()
        if plan.exited:
            log.warning("node lifecycle: some nodes are Ready again; leaving full disruption mode, "
                        "every node gets a fresh grace period")
            for h in self.health.values():
                h.probe = now
                h.stale = False
        for zone, state in plan.states.items():
            if self.zone_states.get(zone) != state and not plan.entered and not plan.exited:
                log.info("node lifecycle: zone %r is now %s", zone, state)
        self.zone_states = dict(plan.states)
        self.all_disrupted = plan.all_disrupted
        for zone, rate in plan.rates.items():
            bucket = self.buckets.get(zone)
            if bucket is None:
                self.buckets[zone] = TokenBucket(rate, now)
            else:
                bucket.set_rate(rate, now)
        for zone in [z for z in self.buckets if z not in plan.rates and not self.taint_queue.get(z)]:
            del self.buckets[zone]
            self.taint_queue.pop(zone, None)
        self._wake_tainter.set()

    async def _reconcile_node(self, name: str, node: dict[str, Any], plan: NodePlan,
                              now: float, stamp: str) -> None:
        async with self._write_limiter:
            try:
                await self._reconcile_node_io(name, node, plan, stamp)
            except RETRYABLE as e:
                log.warning("node lifecycle: node %s: %s; retrying", name, e)
                self._retry_in(self.cfg.retry_backoff)

    async def _reconcile_node_io(self, name: str, node: dict[str, Any], plan: NodePlan, stamp: str) -> None:
        h = self.health.get(name)
        current = self.nodes.get(name)
        if h is None or current is None:
            return
        if current is not node:
            # The watch brought a newer node while we waited for a write slot: judge that one.
            node = current
            plan = plan_node(node, h, trio.current_time(), stamp, self.cfg, all_disrupted=self.all_disrupted)
        was_stale = h.stale
        if plan.conditions is not None:
            was_ready = ready_status(node)
            new_ready = next((c for c in plan.conditions if c.get("type") == "Ready"), None)
            # Our own write must not look like a heartbeat when the watch brings it back.
            h.heartbeat = str(new_ready.get("lastHeartbeatTime")) if new_ready and new_ready.get(
                "lastHeartbeatTime") else h.heartbeat
            try:
                node = await self.api.patch_node(name, {"metadata": {"resourceVersion": _rv(node)},
                                                        "status": {"conditions": plan.conditions}}, status=True)
            except ApiException as e:
                if e.code in (404, 409):
                    # Gone, or written meanwhile (perhaps a heartbeat): judge again with the news.
                    await self._refresh_node(name)
                    return
                raise
            self._remember_node(node)
            silent = trio.current_time() - h.probe
            self.stats.marked_unknown += 1
            self.stats.last_unknown_delay[name] = silent
            log.warning("node lifecycle: node %s has not been heard from for %.1fs: "
                        "conditions set to Unknown", name, silent)
            if was_ready == "True":
                self._emit(node, "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady",
                           NODE_CONTROLLER)
        h.stale = plan.stale
        if plan.stale and not was_stale:
            log.info("node lifecycle: node %s is unreachable", name)

        reset = not h.judged
        tp = plan_taints(node, plan.no_execute, stamp, reset=reset)
        if tp.taints is not None:
            self._note_added(name, tp.taints, stamp)
            node = await self._write_taints(name, node, tp.taints)
            if node is None:
                return
        if reset:
            h.judged = True
            self._evaluate_node(name)
        zone = zone_key(node)
        if tp.queue_no_execute:
            if name not in self.taint_queue[zone]:
                self.taint_queue[zone][name] = None
                self._wake_tainter.set()
        else:
            for q in self.taint_queue.values():
                q.pop(name, None)
        if plan.stale:
            await self._mark_pods_not_ready(name, stamp)

    async def _write_taints(self, name: str, node: dict[str, Any],
                            taints: list[dict[str, Any]]) -> dict[str, Any] | None:
        try:
            fresh = await self.api.patch_node(name, {"metadata": {"resourceVersion": _rv(node)},
                                                     "spec": {"taints": taints or None}})
        except ApiException as e:
            if e.code in (404, 409):
                await self._refresh_node(name)
                return None
            raise
        self._remember_node(fresh)
        return fresh

    def _note_added(self, name: str, taints: list[dict[str, Any]], stamp: str) -> None:
        """Remember the precise time of NoExecute taints we are about to add."""
        for t in taints:
            if t.get("effect") == NO_EXECUTE and t.get("timeAdded") == stamp:
                self._taint_seen[(name, f"{t.get('key')}:{NO_EXECUTE}")] = (stamp, self.wall())

    async def _refresh_node(self, name: str) -> None:
        """After a conflict: read the node now, so the next pass judges what is really there."""
        try:
            fresh = await self.api.get_node(name)
        except RETRYABLE as e:
            log.info("node lifecycle: reading node %s failed: %s", name, e)
            fresh = None
        if fresh is not None:
            self._remember_node(fresh)
        self._retry_in(self.cfg.coalesce)

    def _remember_node(self, node: dict[str, Any]) -> None:
        """Take a node we wrote or read into the cache unless the watch already brought newer."""
        name = _name(node)
        cached = self.nodes.get(name)
        if cached is None or _rv_int(node) > _rv_int(cached):
            self.on_node("ADDED" if cached is None else "MODIFIED", cached, node)

    def _retry_in(self, delay: float) -> None:
        """Have the monitor pass again in `delay` seconds (after a conflict or an error)."""
        self._retry_at = min(self._retry_at, trio.current_time() + delay)

    async def _mark_pods_not_ready(self, name: str, stamp: str) -> None:
        for key in list(self.pods_by_node.get(name, ())):
            pod = self.pods.get(key)
            if pod is None or self._not_ready_done.get(key) == _rv(pod):
                continue
            patch = pod_not_ready_patch(pod, stamp)
            if patch is None:
                continue
            md = pod["metadata"]
            try:
                await self.api.patch_pod_status(md.get("namespace") or "", md["name"], patch)
            except ApiException as e:
                if e.code not in (404, 409):
                    log.info("node lifecycle: marking pod %s not ready failed: %s", key, e)
                continue  # gone, or changed: the next pass looks again
            self._not_ready_done[key] = _rv(pod)
            self.stats.pods_marked_not_ready += 1
            self._emit(pod, "Warning", "NodeNotReady", "Node is not ready", NODE_CONTROLLER)

    # -- the NoExecute tainting queue -------------------------------------------------
    async def _tainter(self) -> None:
        while True:
            wake = self._wake_tainter = trio.Event()
            now = trio.current_time()
            next_at = math.inf
            for zone, queue in list(self.taint_queue.items()):
                # A zone with only excluded nodes has no state of its own: normal rate.
                bucket = self.buckets.setdefault(zone, TokenBucket(self.cfg.eviction_rate, now))
                while queue:
                    if not bucket.try_take(now):
                        t = bucket.next_time(now)
                        if t is not None:
                            next_at = min(next_at, t)
                        break
                    name = next(iter(queue))
                    del queue[name]
                    if not await self._taint_one(name):
                        # Nothing was tainted: give the token back, try again after a back-off.
                        bucket.refund()
                        queue[name] = None
                        next_at = min(next_at, trio.current_time() + self.cfg.retry_backoff)
                        break
            with trio.move_on_at(next_at):
                await wake.wait()

    async def _taint_one(self, name: str) -> bool:
        """Add the NoExecute taint the node calls for *now*; False to retry later."""
        for _attempt in range(3):  # a conflict re-reads the node and decides again
            node = self.nodes.get(name)
            h = self.health.get(name)
            if node is None or h is None or self.all_disrupted:
                return True
            stamp = rfc3339(self.wall())
            target = plan_node(node, h, trio.current_time(), stamp, self.cfg).no_execute if h.judged else None
            if target is None:
                return True  # it recovered while queued
            taints = with_no_execute(node, target, stamp)
            if taints is None:
                return True
            self._note_added(name, taints, stamp)
            try:
                fresh = await self._write_taints(name, node, taints)
            except RETRYABLE as e:
                log.warning("node lifecycle: tainting node %s failed: %s", name, e)
                return False
            if fresh is not None:
                self.stats.tainted += 1
                log.warning("node lifecycle: node %s tainted %s:NoExecute", name, target)
                return True
        return False

    # -- evictions ---------------------------------------------------------------------
    async def _evictor(self) -> None:
        while True:
            wake = self._wake_evictor = trio.Event()
            now = trio.current_time()
            next_at = math.inf
            for key, e in list(self.evictions.items()):
                if e.in_flight:
                    continue
                if e.deadline <= now:
                    e.in_flight = True
                    self._evict_send.send_nowait(key)
                else:
                    next_at = min(next_at, e.deadline)
            with trio.move_on_at(next_at):
                await wake.wait()

    async def _eviction_worker(self) -> None:
        async for key in self._evict_recv:
            try:
                await self._evict_one(key)
            except RETRYABLE as e:
                log.warning("node lifecycle: evicting %s failed: %s; retrying", key, e)
                ev = self.evictions.get(key)
                if ev is not None:
                    ev.in_flight = False
                    ev.deadline = trio.current_time() + self.cfg.retry_backoff
                    self._wake_evictor.set()

    async def _evict_one(self, key: str) -> None:
        ev = self.evictions.get(key)
        if ev is None:
            return
        # Decide again: taints, tolerations or the pod may have changed since scheduling.
        name, at = self._decide(key)
        if name is None or at is None:
            ev.in_flight = False
            self._cancel(key, event=True)
            return
        delay = at - self.wall()
        if delay > 1e-3:
            ev.in_flight = False
            ev.deadline = trio.current_time() + delay
            self._wake_evictor.set()
            return
        pod = self.pods[key]
        md = pod["metadata"]
        self._emit(pod, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {key}",
                   TAINT_EVICTION_CONTROLLER)
        log.info("node lifecycle: evicting pod %s from node %s (NoExecute taint)", key, name)
        ns = md.get("namespace") or ""
        # The DisruptionTarget condition tells owners (and users) why the pod went.
        await self._disruption_condition(pod, {"type": "DisruptionTarget", "status": "True",
                                               "reason": "DeletionByTaintManager",
                                               "message": "Taint manager: deleting due to NoExecute taint",
                                               "lastTransitionTime": rfc3339(self.wall())})
        try:
            await self.api.delete_pod(ns, md["name"], md.get("uid"))
        except ApiException as e:
            if e.code not in (404, 409):  # gone, or a new pod of the same name: nothing to do
                raise
        self._deleted[key] = md.get("uid")
        self.evictions.pop(key, None)
        self.stats.evicted += 1

    async def _disruption_condition(self, pod: dict[str, Any], condition: dict[str, Any],
                                    phase: str | None = None) -> None:
        """Best effort: say why the pod goes (a failure here must not keep it)."""
        md = pod["metadata"]
        status: dict[str, Any] = {"conditions": [condition]}
        if phase is not None:
            status["phase"] = phase
        try:
            await self.api.patch_pod_status(md.get("namespace") or "", md["name"], {"status": status})
        except ApiException as e:
            if e.code != 404:
                log.info("node lifecycle: setting %s on pod %s failed: %s", condition["type"],
                         pod_key(pod), e)

    # -- the pod GC of pods whose node is gone --------------------------------------------
    async def _collect_orphans(self, now: float, stamp: str) -> float:
        next_at = math.inf
        due: dict[str, list[str]] = defaultdict(list)
        for node, keys in list(self.pods_by_node.items()):
            if node in self.nodes:
                continue
            for key in keys:
                since = self.orphan_since.setdefault(key, now)
                if now - since >= self.cfg.quarantine:
                    due[node].append(key)
                else:
                    next_at = min(next_at, since + self.cfg.quarantine)
        for node, keys in due.items():
            try:
                # The informer may lag: ask the API before deleting anything (as k8s does).
                live = await self.api.get_node(node)
            except RETRYABLE as e:
                log.info("node lifecycle: checking node %s failed: %s", node, e)
                continue
            if live is not None:
                self._remember_node(live)
                continue
            for key in keys:
                await self._delete_orphan(key, node, stamp)
        return next_at

    async def _delete_orphan(self, key: str, node: str, stamp: str) -> None:
        pod = self.pods.get(key)
        if pod is None:
            return
        md = pod["metadata"]
        ns = md.get("namespace") or ""
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        try:
            await self._disruption_condition(pod, {"type": "DisruptionTarget", "status": "True",
                                                   "reason": "DeletionByPodGC",
                                                   "message": "PodGC: node no longer exists",
                                                   "lastTransitionTime": stamp},
                                             phase=None if finished else "Failed")
            # No node will ever confirm the pod stopped: delete it for good.
            await self.api.delete_pod(ns, md["name"], md.get("uid"), grace_period=0)
        except ApiException as e:
            if e.code not in (404, 409):
                log.info("node lifecycle: deleting orphaned pod %s failed: %s", key, e)
                return
        except RETRYABLE as e:
            log.info("node lifecycle: deleting orphaned pod %s failed: %s", key, e)
            return
        self.orphan_since.pop(key, None)
        self.stats.orphans_deleted += 1
        log.info("node lifecycle: deleted pod %s: its node %s no longer exists", key, node)


def _fingerprint(node: Mapping[str, Any]) -> Any:
    """What about a node can change the monitor's decisions (heartbeat times excluded)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    conds = tuple(sorted((str(c.get("type")), str(c.get("status")))
                         for c in (node.get("status") or {}).get("conditions") or [] if isinstance(c, dict)))
    return (conds, node_taints(node), (node.get("spec") or {}).get("unschedulable"), zone_key(node),
            EXCLUDE_DISRUPTION_LABEL in labels)
