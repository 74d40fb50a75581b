"""Simulated nodes, the KWOK model: many hollow nodes in one process, no containers.

`fleet agent --simulate N` registers N Nodes that look real to the control plane
— capacity, labels and zones, nodeInfo, addresses, a Ready condition — renews
their Leases, and moves the pods the scheduler binds to them through the kubelet's
lifecycle without running anything:

    bound (Pending) ──start delay──▶ Running (containers running and ready,
        │                            podIP, hostIP, startTime, four conditions)
        │                                 │ restartPolicy Never (or OnFailure with
        │                                 │ exit code 0) and the annotation
        │                                 │ fleet.dev/simulate-exit-after: "<s>"
        │                                 ▼
        │                            Succeeded / Failed (exit code from
        │                            fleet.dev/simulate-exit-code, default 0)
        ▼
    deletionTimestamp set (any state) ──▶ DELETE gracePeriodSeconds=0 with a uid
                                          precondition, as the kubelet does once
                                          its containers have stopped

That is enough to prove the scheduler, the node lifecycle controller and the
workload controllers at a scale no test machine can host for real (Kubernetes
does the same with KWOK and kubemark).  Simulated and real nodes share a cluster:
pods bound to nodes this process does not own are ignored.

**Why it is shaped like this.**  The scheduler benchmark runs 5,000 simulated
nodes and 10,000 pods against one Python server on a 2-core machine, so the
simulator has to be frugal with the server and with itself:

* one cluster-wide pod watch (`spec.nodeName!=`, so unbound pods never come
  through) filtered by node name here — field selectors have no set form, and
  5,000 watches would cost the server far more than one;
* no task per node or per pod: one timer task per heap (node heartbeats, pod
  start/exit times) feeds fixed pools of worker tasks through work queues, so
  concurrency towards the server is bounded (`SimulatorConfig.lease_workers`,
  `pod_concurrency`) and a pod is never handled by two workers at once;
* every worker owns one single-connection client: httpx's shared pool rescans all
  its connections on each request, which costs more CPU than the request itself
  at these rates (see bench/README.md), and a keep-alive limit below the number
  of workers would mean a TLS handshake per request;
* Leases are renewed every `lease_interval` with each node at a fixed phase
  (node i of N at i/N of the interval), so 5,000 renewals are spread evenly
  instead of arriving in one burst every ten seconds.  They fire on 0.25 s ticks
  rather than each at its exact moment: writes that arrive together share one
  SQLite transaction (the store's group commit) and one wake-up of the server,
  while writes 2 ms apart each pay for their own — measured with 1,000 nodes,
  the server's CPU went from about 30% to 21% and the simulator's from 18% to
  13%, with renewals still spread over 40 small groups per interval;
* the Node status (conditions' heartbeat) is written, as the modern kubelet does,
  only when it changes (a resumed node) and every `node_status_interval` — Leases
  are the cheap liveness signal, status writes wake every node watcher;
* liveness first: the server has no priority between requests, so when Lease
  renewals start running late (> 1 s) all pod workers but one stand aside until
  they catch up — otherwise a burst of pod starts delays heartbeats past the
  grace period and the node lifecycle controller evicts the pods being started
  (measured: 500 nodes and 2,000 pods on a loaded machine, renewals went from
  ~20% to ~80% of schedule);
* per pod only a small record is kept, plus — until it is Running — the few
  fields its status is computed from (`slim_pod`): 10,000 bound-but-waiting pods
  cost the simulator 31 MB that way, 91 MB as full objects.

Pod addresses come from the node's `spec.podCIDR` when node IPAM gave it one (the
default cluster CIDR has room for 256 /24s only), otherwise from a private /24 per
node in 100.64.0.0/10 (shared address space, so it cannot clash with real pod
networks).  Nodes' InternalIPs are in 198.18.0.0/15, the range reserved for
benchmarking: nothing answers there, as nothing should.

Tests and benchmarks drive `Simulator` directly (`await nursery.start(sim.run)`,
`sim.pause_heartbeats(name)`); a simulator in another process is steered through
an optional loopback HTTP endpoint (`control_port`): `GET /nodes`, `GET /stats`,
`POST /nodes/<name>/pause[?freezePods=true]`, `POST /nodes/<name>/resume`.

The pure model (configuration, addresses, the objects written, the timer heap)
is `simulate_model.py`; this module is the `Simulator`, its I/O and its control
endpoint, and re-exports the model's public names.

Resource usage: simulated nodes serve no metrics themselves (nothing runs, and
their addresses answer nothing).  A pod may declare the usage it pretends to
have with the `fleet.dev/simulate-cpu` / `fleet.dev/simulate-memory`
annotations; the API server's resource metrics API reads them for pods on
nodes labelled `fleet.dev/simulated=true` (fleet/api/kinds/metrics.py), so
`kubectl top` and the HPA work on simulated nodes too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import trio

from fleet.agent.node import LEASE_NAMESPACE, now_micro
from fleet.agent.simulate_model import (
    BOUND_PODS,
    DEFAULT_SHAPES,
    EXIT_AFTER_ANNOTATION,
    EXIT_CODE_ANNOTATION,
    GONE,
    LEASE_LAG_LIMIT,
    PENDING,
    RETRYABLE,
    RUNNING,
    SIMULATED_LABEL,
    TERMINAL,
    AddressBlock,
    NodeShape,
    SimNode,
    SimulatorConfig,
    SimulatorStats,
    TimerQueue,
    exit_plan,
    exited_status,
    fallback_pod_cidr,
    first_due,
    lease_object,
    make_nodes,
    next_due,
    node_labels,
    node_names,
    node_object,
    node_status,
    ready_conditions,
    running_status,
    slim_pod,
    zone_names,
)
from fleet.api.meta import now_rfc3339
from fleet.client import MERGE_PATCH, ApiException, Client, ClientConfig, resource_path
from fleet.client.errors import explain
from fleet.client.informer import Informer
from fleet.client.rest import ssl_context

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- pods


@dataclass(slots=True)
class PodRecord:
    """What the simulator remembers of one pod bound to one of its nodes."""

    uid: str
    namespace: str
    name: str
    node: str
    state: str = PENDING
    pod: dict[str, Any] | None = None  # kept until Running (and while an exit is planned)
    ip: str | None = None
    start_at: float = 0.0
    started: str = ""
    exit_at: float | None = None
    exit_code: int = 0
    deleting: bool = False
    busy: bool = False
    again: bool = False


class _Throttle:
    """At most one warning per `period` per kind, with a count of the ones held back.

    A server restart would otherwise log one line per node per heartbeat.
    """

    def __init__(self, period: float = 10.0) -> None:
        self.period = period
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, kind: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -math.inf) < self.period:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        held = self._held.pop(kind, 0)
        self._last[kind] = now
        log.warning(msg + (f" (and {held} more like it)" if held else ""), *args)


# --------------------------------------------------------------------------- simulator


class Simulator:
    """N simulated nodes: registration, heartbeats and pod lifecycle (see the module docstring)."""

    def __init__(self, cfg: SimulatorConfig, client_config: ClientConfig, *,
                 client_factory: Callable[[], Client] | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.client_config = client_config
        self._client_factory = client_factory
        self.nodes: dict[str, SimNode] = {n.name: n for n in make_nodes(cfg)}
        self.node_names: list[str] = list(self.nodes)
        self.pods: dict[str, PodRecord] = {}
        self.stats = SimulatorStats()
        self.control_url: str | None = None
        self.boot_id = str(uuid.uuid4())
        self._origin = 0.0
        self._hb_timers = TimerQueue(cfg.heartbeat_tick)
        self._pod_timers = TimerQueue()
        self._lease_send, self._lease_recv = trio.open_memory_channel[tuple[str, int, str]](math.inf)
        self._pod_send, self._pod_recv = trio.open_memory_channel[str](math.inf)
        self._pod_queued: set[str] = set()
        self._lease_lag = 0.0  # how late the last renewal taken from the queue was
        self._pods_informer: Informer | None = None
        self._throttle = _Throttle()

    # -- public controls --------------------------------------------------------------

    def pause_heartbeats(self, node_name: str, *, freeze_pods: bool = False) -> None:
        """Stop renewing `node_name`'s Lease and posting its status (a silent kubelet).

        With `freeze_pods` its pods are left alone too — nothing starts, nothing is
        finalized — as for a node cut off by a network partition.
        """
        node = self.nodes[node_name]
        node.paused = True
        node.frozen = node.frozen or freeze_pods
        node.hb_token += 1  # heartbeats already queued for it are dropped

    def resume_heartbeats(self, node_name: str) -> None:
        """Renew at once and post status again; catch up on pods if they were frozen."""
        node = self.nodes[node_name]
        if not node.paused:
            return
        node.paused = False
        node.hb_token += 1
        # The node lifecycle controller has most likely marked it Unknown meanwhile:
        # Ready=True is a transition again, and is written with this renewal.
        node.ready_since = now_rfc3339()
        node.status_dirty = True
        if node.registered:
            self._schedule_heartbeats(node, renew_now=True)
        if node.frozen:
            node.frozen = False
            self._catch_up(node.name)

    def last_renewal(self, node_name: str) -> float | None:
        """trio.current_time() of the node's last successful Lease renewal."""
        return self.nodes[node_name].last_renewal

    # -- the service -------------------------------------------------------------------

    def _make_client(self) -> Client:
        if self._client_factory is not None:
            return self._client_factory()
        transport = httpx.AsyncHTTPTransport(
            verify=ssl_context(self.client_config),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        return Client(self.client_config, user_agent="fleet-simulator", transport=transport)

    async def run(self, *, task_status: trio.TaskStatus[Simulator] = trio.TASK_STATUS_IGNORED) -> None:
        """Register every node, then heartbeat and follow pods until cancelled.

        `started` once every node is registered and the pod watch is listening.
        """
        lease_clients = [self._make_client() for _ in range(self.cfg.lease_workers)]
        pod_clients = [self._make_client() for _ in range(self.cfg.pod_concurrency)]
        watch_client = self._make_client()
        try:
            async with trio.open_nursery() as n:
                self._origin = trio.current_time()
                # Heartbeats run while the rest registers: registering thousands of
                # nodes can take longer than a Lease lasts.
                n.start_soon(self._hb_timers.run, self._fire_heartbeat)
                for c in lease_clients:
                    n.start_soon(self._lease_worker, c)
                t0 = trio.current_time()
                await self._register_all(lease_clients + pod_clients)
                self.stats.registration_seconds = trio.current_time() - t0
                log.info("simulator: %d nodes registered in %.1fs", len(self.nodes),
                         self.stats.registration_seconds)
                for i, c in enumerate(pod_clients):
                    n.start_soon(self._pod_worker, c, i)
                n.start_soon(self._pod_timers.run, self._enqueue_pod)
                await n.start(self._watch_pods, watch_client)
                if self.cfg.control_port is not None:
                    self.control_url = await n.start(self._serve_control, self.cfg.control_port)
                    log.info("simulator control endpoint on %s", self.control_url)
                task_status.started(self)
        finally:
            with trio.CancelScope(shield=True):
                for c in [*lease_clients, *pod_clients, watch_client]:
                    await c.aclose()

    # -- registration -------------------------------------------------------------------

    async def _register_all(self, clients: list[Client]) -> None:
        todo = iter(list(self.nodes.values()))

        async def worker(client: Client) -> None:
            for node in todo:  # a shared iterator: each node is taken once
                await self._register_with_retry(client, node)

        async with trio.open_nursery() as n:
            for c in clients:
                n.start_soon(worker, c)

    async def _register_with_retry(self, client: Client, node: SimNode) -> None:
        backoff = self.cfg.retry_backoff
        while True:
            try:
                await self._register(client, node)
                return
            except RETRYABLE as e:
                self._throttle.warn("register", "simulator: registering node %s failed: %s",
                                    node.name, explain(e))
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _register(self, client: Client, node: SimNode) -> None:
        now = now_rfc3339()
        node.ready_since = node.ready_since or now
        body = node_object(self.cfg, node, boot_id=self.boot_id, now=now)
        try:
            obj = await client.create("v1", "nodes", body)
        except ApiException as e:
            if e.code != 409:
                raise
            # Ours from an earlier run (or someone else's of the same name): take it over.
            await client.patch("v1", "nodes", node.name, {"metadata": body["metadata"]})
            obj = await client.patch("v1", "nodes", node.name, {"status": body["status"]},
                                     subresource="status")
        self._learn(node, obj)
        micro = now_micro()
        try:
            await client.create("coordination.k8s.io/v1", "leases",
                                lease_object(self.cfg, node, micro), namespace=LEASE_NAMESPACE)
        except ApiException as e:
            if e.code != 409:
                raise
            await self._renew(client, node)
        t = trio.current_time()
        node.last_renewal = t
        if not node.registered:
            node.registered = True
            self.stats.nodes_registered += 1
            if not node.paused:
                self._schedule_heartbeats(node)

    def _learn(self, node: SimNode, obj: Mapping[str, Any]) -> None:
        node.uid = str((obj.get("metadata") or {}).get("uid") or node.uid)
        cidr = (obj.get("spec") or {}).get("podCIDR")
        if cidr:
            node.pod_cidr = str(cidr)

    # -- heartbeats ---------------------------------------------------------------------

    def _schedule_heartbeats(self, node: SimNode, *, renew_now: bool = False) -> None:
        """Put the node's Lease renewal and status heartbeat on the heap, each at its phase.

        Two entries with phases of their own (rather than "post status with every
        k-th renewal"): both streams of writes then stay evenly spread.
        """
        now = trio.current_time()
        n = len(self.nodes)
        node.lease_due = first_due(node.index, n, self.cfg.lease_interval, self._origin, now)
        node.status_due = first_due(node.index, n, self.cfg.node_status_interval, self._origin,
                                    now)
        fire_at = node.lease_due
        if renew_now:
            # Renew at once, then carry on at the node's phase: the slot before
            # `now` is where the next one is counted from.
            node.lease_due -= self.cfg.lease_interval
            fire_at = now
        self._hb_timers.push(fire_at, (node.name, node.hb_token, "lease"))
        self._hb_timers.push(node.status_due, (node.name, node.hb_token, "status"))

    def _fire_heartbeat(self, key: tuple[str, int, str]) -> None:
        name, token, _ = key
        node = self.nodes[name]
        if token == node.hb_token and not node.paused:
            self._lease_send.send_nowait(key)

    async def _lease_worker(self, client: Client) -> None:
        async for name, token, kind in self._lease_recv:
            node = self.nodes[name]
            if node.paused or token != node.hb_token:
                continue  # paused (or paused and resumed) since it was queued
            if kind == "lease":
                self._lease_lag = trio.current_time() - node.lease_due
            try:
                if kind == "lease":
                    await self._heartbeat(client, node, token)
                else:
                    await self._status_heartbeat(client, node, token)
            except Exception:
                # A bug must not silence every node: log it, keep the node beating.
                log.exception("simulator: %s heartbeat of %s", kind, name)
                self._hb_timers.push(trio.current_time() + self.cfg.lease_interval,
                                     (name, token, kind))

    async def _heartbeat(self, client: Client, node: SimNode, token: int) -> None:
        interval = self.cfg.lease_interval
        ok = await self._renew_logged(client, node)
        now = trio.current_time()
        if ok:
            if node.status_dirty:  # a change is written at once, not at the next slot
                await self._post_status(client, node)
            node.lease_due = next_due(node.lease_due, interval, now)
        else:
            node.lease_due = now + min(interval, 2.0)
        self._hb_timers.push(node.lease_due, (node.name, token, "lease"))

    async def _status_heartbeat(self, client: Client, node: SimNode, token: int) -> None:
        now = trio.current_time()
        if await self._post_status(client, node):
            node.status_due = next_due(node.status_due, self.cfg.node_status_interval, now)
        else:
            node.status_due = now + min(self.cfg.node_status_interval, 5.0)
        self._hb_timers.push(node.status_due, (node.name, token, "status"))

    async def _renew_logged(self, client: Client, node: SimNode) -> bool:
        try:
            await self._renew(client, node)
        except RETRYABLE as e:
            self.stats.lease_failures += 1
            self._throttle.warn("lease", "simulator: renewing the lease of %s failed: %s",
                                node.name, e)
            return False
        node.last_renewal = trio.current_time()
        self.stats.lease_renewals += 1
        return True

    async def _renew(self, client: Client, node: SimNode) -> None:
        """PATCH the Lease's renewTime (a small body, and no response decoding)."""
        micro = now_micro()
        body = json.dumps({"spec": {"holderIdentity": node.name,
                                    "leaseDurationSeconds": self.cfg.lease_duration,
                                    "renewTime": micro}})
        path = resource_path("coordination.k8s.io/v1", "leases", LEASE_NAMESPACE, node.name)
        try:
            await client.request("PATCH", path, content=body,
                                 headers={"Content-Type": MERGE_PATCH})
        except ApiException as e:
            if e.code != 404:
                raise
            await client.create("coordination.k8s.io/v1", "leases",
                                lease_object(self.cfg, node, micro), namespace=LEASE_NAMESPACE)

    async def _post_status(self, client: Client, node: SimNode) -> bool:
        """Write the node's conditions (its status heartbeat); False if that failed."""
        now = now_rfc3339()
        try:
            obj = await client.patch(
                "v1", "nodes", node.name,
                {"status": {"conditions": ready_conditions(now, node.ready_since or now)}},
                subresource="status")
        except ApiException as e:
            if e.code == 404:
                # Someone deleted the Node: register it again, as the kubelet does.
                log.warning("simulator: node %s was deleted; registering it again", node.name)
                try:
                    await self._register(client, node)
                except RETRYABLE as e2:
                    self._throttle.warn("status", "simulator: re-registering %s failed: %s",
                                        node.name, e2)
                    return False
            else:
                self._throttle.warn("status", "simulator: node status of %s failed: %s",
                                    node.name, e)
                return False
        except (httpx.TransportError, OSError) as e:
            self._throttle.warn("status", "simulator: node status of %s failed: %s", node.name, e)
            return False
        else:
            self._learn(node, obj)
        node.status_dirty = False
        self.stats.node_status_updates += 1
        return True

    # -- the pod watch -------------------------------------------------------------------

    async def _watch_pods(self, client: Client, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow every bound pod through the one client informer (fleet.client.informer):
        a re-list after a 410 or a lost connection reports pods deleted meanwhile as
        DELETED, which drops their records."""
        self._pods_informer = inf = Informer(client, "v1", "pods", self._on_pod_change,
                                             field_selector=BOUND_PODS,
                                             retry_backoff=self.cfg.retry_backoff, component="simulator")
        inf.add_index("node", lambda p: [str((p.get("spec") or {}).get("nodeName") or "")])
        await inf.run(task_status=task_status)

    def _on_pod_change(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            if old is not None:
                self.on_pod_event("DELETED", old)
        elif new is not None:
            self.on_pod_event(etype, new)

    def _catch_up(self, node_name: str) -> None:
        """After a frozen node resumes: what happened to its pods meanwhile (the informer
        kept following them while the node ignored its events)."""
        inf = self._pods_informer
        if inf is None:
            return
        seen: set[str] = set()
        for pod in inf.by_index("node", node_name):
            seen.add(str((pod.get("metadata") or {}).get("uid")))
            self.on_pod_event("ADDED", pod)
        for uid, rec in list(self.pods.items()):
            if rec.node != node_name:
                continue
            if uid not in seen:
                self._drop(rec)
            else:
                # Whatever fell due while the node was frozen was skipped: look again.
                self._enqueue_pod(uid)

    def on_pod_event(self, etype: str, pod: dict[str, Any]) -> None:
        """Fold one watch event into the records and queue whatever it makes due."""
        md = pod.get("metadata") or {}
        uid = md.get("uid")
        if not uid:
            return
        if etype == "DELETED":
            rec = self.pods.get(uid)
            if rec is not None:
                self._drop(rec)
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = self.nodes.get(node_name) if node_name else None
        if node is None or node.frozen:
            return  # not ours (a real node, another simulator), or cut off
        rec = self.pods.get(uid)
        if rec is None:
            rec = PodRecord(uid=uid, namespace=md.get("namespace") or "", name=md.get("name") or "",
                            node=node.name)
            self.pods[uid] = rec
            self._adopt(rec, node, pod)
        if md.get("deletionTimestamp") and not rec.deleting:
            rec.deleting = True
            self._enqueue_pod(uid)

    def _adopt(self, rec: PodRecord, node: SimNode, pod: dict[str, Any]) -> None:
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase in ("Succeeded", "Failed"):
            rec.state = TERMINAL
            return
        statuses = status.get("containerStatuses") or []
        if phase == "Running" and statuses and all("running" in (c.get("state") or {})
                                                   for c in statuses):
            # Started by an earlier run of this simulator: keep its address.
            rec.state = RUNNING
            rec.ip = status.get("podIP")
            rec.started = str(status.get("startTime") or now_rfc3339())
            if rec.ip and not (pod.get("spec") or {}).get("hostNetwork"):
                node.claim_ip(rec.ip)
            plan = exit_plan(pod)
            if plan is not None:
                rec.pod = slim_pod(pod)
                rec.exit_code = plan[1]
                rec.exit_at = trio.current_time() + plan[0]
                self._pod_timers.push(rec.exit_at, rec.uid)
            return
        rec.pod = slim_pod(pod)
        rec.start_at = trio.current_time() + self.cfg.start_delay
        if self.cfg.start_delay > 0:
            self._pod_timers.push(rec.start_at, rec.uid)
        else:
            self._enqueue_pod(rec.uid)

    def _drop(self, rec: PodRecord) -> None:
        self.pods.pop(rec.uid, None)
        rec.state = GONE
        rec.pod = None
        self._release(rec)

    def _release(self, rec: PodRecord) -> None:
        node = self.nodes.get(rec.node)
        if node is not None and rec.ip and rec.ip != node.address:
            node.release_ip(rec.ip)
        rec.ip = None

    def _enqueue_pod(self, uid: str) -> None:
        if uid not in self._pod_queued:
            self._pod_queued.add(uid)
            self._pod_send.send_nowait(uid)

    # -- pod workers ----------------------------------------------------------------------

    def heartbeats_behind(self) -> bool:
        """Lease renewals are waiting and running late (the server cannot keep up)."""
        return (self._lease_lag > LEASE_LAG_LIMIT
                and self._lease_recv.statistics().current_buffer_used > 0)

    async def _pod_worker(self, client: Client, index: int = 0) -> None:
        """Pod work, except that liveness comes first.

        Fleet's server has no priority and fairness between requests (Kubernetes
        gives node heartbeats their own priority level), so when it falls behind,
        16 pod status writes in flight take most of its time and Leases expire —
        and the node lifecycle controller then evicts the very pods being
        started.  While renewals run late, all pod workers but one wait.
        """
        async for uid in self._pod_recv:
            if index > 0 and self.heartbeats_behind():
                # Hand the pod back (worker 0 never waits, so it is not stuck) and
                # wait holding nothing.
                self._pod_send.send_nowait(uid)
                self.stats.pod_work_deferred += 1
                while self.heartbeats_behind():
                    await trio.sleep(0.1)
                continue
            self._pod_queued.discard(uid)
            rec = self.pods.get(uid)
            if rec is None:
                continue
            if rec.busy:
                rec.again = True  # another worker has it; it looks again when done
                continue
            rec.busy = True
            try:
                await self._sync_pod(client, rec)
            except RETRYABLE as e:
                self.stats.pod_request_failures += 1
                self._throttle.warn("pod", "simulator: pod %s/%s: %s", rec.namespace, rec.name, e)
                self._pod_timers.push(trio.current_time() + self.cfg.retry_backoff, uid)
            except Exception:
                log.exception("simulator: pod %s/%s", rec.namespace, rec.name)
            finally:
                rec.busy = False
            if rec.again:
                rec.again = False
                self._enqueue_pod(uid)

    async def _sync_pod(self, client: Client, rec: PodRecord) -> None:
        """Do what is due for one pod: finalize a deletion, start it, or let it exit."""
        node = self.nodes[rec.node]
        if rec.state == GONE or node.frozen:
            return
        now = trio.current_time()
        if rec.deleting:
            try:
                await client.delete("v1", "pods", rec.name, rec.namespace,
                                    body={"apiVersion": "v1", "kind": "DeleteOptions",
                                          "gracePeriodSeconds": 0,
                                          "preconditions": {"uid": rec.uid}})
            except ApiException as e:
                if e.code not in (404, 409):  # gone already, or a new pod of that name
                    raise
            self.stats.pods_deleted += 1
            rec.state = GONE  # its DELETED event (or the next list) drops the record
            rec.pod = None
            self._release(rec)
            return
        if rec.state == PENDING:
            if now < rec.start_at:
                self._pod_timers.push(rec.start_at, rec.uid)
                return
            await self._start(client, node, rec)
        elif rec.state == RUNNING and rec.exit_at is not None:
            if now < rec.exit_at:
                self._pod_timers.push(rec.exit_at, rec.uid)
                return
            await self._exit(client, node, rec)

    async def _start(self, client: Client, node: SimNode, rec: PodRecord) -> None:
        pod = rec.pod
        assert pod is not None
        if not node.pod_cidr and not node.cidr_checked:
            # Node IPAM assigns ranges just after registration: look once, before
            # this node's first pod takes an address.
            node.cidr_checked = True
            self._learn(node, await client.get_object("v1", "nodes", node.name))
        if rec.ip is None:
            rec.ip = (node.address if (pod.get("spec") or {}).get("hostNetwork")
                      else node.allocate_ip())
        now = now_rfc3339()
        status = running_status(pod, pod_ip=rec.ip, host_ip=node.address, now=now)
        if not await self._write_status(client, rec, status):
            return
        rec.state = RUNNING
        rec.started = now
        self.stats.pods_started += 1
        plan = exit_plan(pod)
        if plan is None:
            rec.pod = None
            return
        rec.exit_at = trio.current_time() + plan[0]
        rec.exit_code = plan[1]
        self._pod_timers.push(rec.exit_at, rec.uid)

    async def _exit(self, client: Client, node: SimNode, rec: PodRecord) -> None:
        assert rec.pod is not None
        status = exited_status(rec.pod, pod_ip=rec.ip or "", host_ip=node.address,
                               started=rec.started, exit_code=rec.exit_code, now=now_rfc3339())
        if not await self._write_status(client, rec, status):
            return
        rec.state = TERMINAL
        rec.pod = None
        self.stats.pods_finished += 1
        self._release(rec)

    async def _write_status(self, client: Client, rec: PodRecord, status: dict[str, Any]) -> bool:
        try:
            await client.request(
                "PATCH", resource_path("v1", "pods", rec.namespace, rec.name, "status"),
                content=json.dumps({"status": status}), headers={"Content-Type": MERGE_PATCH})
        except ApiException as e:
            if e.code != 404:
                raise
            rec.state = GONE
            self._release(rec)
            return False
        return True

    # -- the control endpoint -------------------------------------------------------------

    async def _serve_control(self, port: int, *,
                             task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        bound = listeners[0].socket.getsockname()[1]
        task_status.started(f"http://127.0.0.1:{bound}")
        await trio.serve_listeners(self._control_connection, listeners)

    async def _control_connection(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(10):
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 16384:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    data += chunk
                line = data.split(b"\r\n", 1)[0].decode("latin-1")
                parts = line.split()
                if len(parts) < 2:
                    code, body = 400, {"error": "bad request"}
                else:
                    code, body = self.control(parts[0], parts[1])
                payload = json.dumps(body).encode()
                head = (f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                        "Connection: close\r\n\r\n").encode()
                await stream.send_all(head + payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    def control(self, method: str, target: str) -> tuple[int, Any]:
        """One control request: (HTTP status, JSON body).  Pure dispatch, testable."""
        url = urlsplit(target)
        query = parse_qs(url.query)
        segs = [s for s in url.path.split("/") if s]
        if method == "GET" and segs == ["nodes"]:
            return 200, {"nodes": [self._node_info(n) for n in self.nodes.values()]}
        if method == "GET" and segs == ["stats"]:
            return 200, {**dataclasses.asdict(self.stats), "pods_tracked": len(self.pods)}
        if len(segs) == 3 and segs[0] == "nodes" and method == "POST":
            name, action = segs[1], segs[2]
            if name not in self.nodes:
                return 404, {"error": f"no simulated node {name}"}
            if action == "pause":
                freeze = (query.get("freezePods") or ["false"])[0].lower() in ("1", "true", "yes")
                self.pause_heartbeats(name, freeze_pods=freeze)
            elif action == "resume":
                self.resume_heartbeats(name)
            else:
                return 404, {"error": f"unknown action {action}"}
            return 200, self._node_info(self.nodes[name])
        return 404, {"error": "not found"}

    def _node_info(self, node: SimNode) -> dict[str, Any]:
        age = (None if node.last_renewal is None
               else round(trio.current_time() - node.last_renewal, 3))
        return {"name": node.name, "zone": node.zone, "instanceType": node.shape.instance_type,
                "paused": node.paused, "frozenPods": node.frozen, "registered": node.registered,
                "podCIDR": node.pod_cidr, "secondsSinceRenewal": age}


def simulated_pods_per_node(sim: Simulator) -> dict[str, int]:
    """Pods each node currently runs (records not yet gone), for tests and reports."""
    out = dict.fromkeys(sim.node_names, 0)
    for rec in sim.pods.values():
        if rec.state in (PENDING, RUNNING):
            out[rec.node] += 1
    return out


__all__ = [
    "DEFAULT_SHAPES", "EXIT_AFTER_ANNOTATION", "EXIT_CODE_ANNOTATION", "SIMULATED_LABEL",
    "AddressBlock", "NodeShape", "PodRecord", "SimNode", "Simulator", "SimulatorConfig",
    "SimulatorStats", "TimerQueue", "exit_plan", "exited_status", "fallback_pod_cidr",
    "first_due", "lease_object", "make_nodes", "next_due", "node_labels", "node_names",
    "node_object", "node_status", "ready_conditions", "running_status", "simulated_pods_per_node",
    "slim_pod", "zone_names",
]
