"""The scheduler's I/O loop: informers in, bindings and events out.

    informers (nodes, pods, ──> Snapshot + SchedulingQueue
    claims, volumes, ...)
                                        │ pop()
                                        ▼
                           Framework.schedule(pod, snapshot)   (pure, synchronous)
                             │ node                    │ FitError
                             ▼                         ▼
                 assume in Snapshot,          post-filter (preemption): maybe
                 reserve, [pre-bind:          nominate a node and delete victims;
                 volumes], POST               park as unschedulable,
                 pods/{p}/binding             FailedScheduling event,
                 (in the background)          PodScheduled=False condition

The pod is *assumed* on its node in the snapshot before the binding
request is sent, so the next cycle already counts its requests and binds
can run concurrently (kube-scheduler's assume/bind split).  A failed bind
forgets the assumption and retries the pod after back-off.

Volumes (VolumeBinding).  Besides nodes, namespaces, claims and pods the
snapshot is fed PersistentVolumes, StorageClasses, CSINodes, CSIDrivers and
CSIStorageCapacities — each informer started only when the server serves the
kind (discovery), every change retrying parked pods.  After the pod is assumed,
the framework's reserve point promises the chosen volumes in the snapshot; a pod
whose volumes still need binding then runs the pre-bind point in its own task
(no bind slot held while it waits): the chosen PersistentVolumes get their
claimRef, claims to provision their selected-node, and the task waits —
`SchedulerConfig.volume_bind_timeout`, looking every `volume_poll_interval` —
until the informers show every claim bound.  Only then is the Binding posted.  A
pre-bind failure (provisioning failed, timeout, conflict) takes the promises
back, forgets the assumption, records FailedScheduling (PodScheduled=False,
reason SchedulerError) and retries the pod after back-off.

Pods with `spec.schedulerName` other than ours are never scheduled, but if
bound they still count against their node.

Preemption: when no node fits, the DefaultPreemption post-filter may name a
node where evicting lower-priority pods makes room.  The loop then writes the
pod's `status.nominatedNodeName`, records a `Preempted` event on each victim
and deletes it (gracefully; its node's agent stops it), and parks the pod.
The victims leaving is a cluster event that retries it; until then the
framework counts it on the nominated node, so lower-priority pods cannot take
the room.

One bad object never stops the scheduler: the informers skip objects without
the common envelope and survive a handler raising (fleet.client.informer), and a
scheduling cycle that raises on one pod (a plugin tripping over a malformed
field) is logged with the pod's key, counted in `fleet_object_errors_total` and
the pod retried after back-off, while every other pod is scheduled as usual.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from fleet._core.supervise import object_failed
from fleet.api import meta
from fleet.client import STRATEGIC_MERGE_PATCH, ApiException, Client, ClientConfig
from fleet.client.events import EventRecorder
from fleet.client.fast import FastConnection
from fleet.client.informer import Informer
from fleet.client.rest import ssl_context
from fleet.scheduler.framework import (
    BindHandle,
    CycleState,
    FitError,
    Framework,
    Nomination,
    Status,
    pod_priority,
)
from fleet.scheduler.plugins import default_plugins, default_weights
from fleet.scheduler.plugins.default_preemption import DefaultPreemption
from fleet.scheduler.podinfo import is_terminated, pod_key
from fleet.scheduler.queue import SchedulingQueue
from fleet.scheduler.snapshot import Snapshot

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME = "default-scheduler"
# Succeeded/Failed pods hold nothing on their node; the server turns their
# transition out of this selector into a DELETED event.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass
class SchedulerConfig:
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    initial_backoff: float = 1.0
    max_backoff: float = 10.0
    unschedulable_timeout: float = 300.0
    parallel_binds: int = 16
    # Scheduled events wait here for a sender (binding comes first); the queue is
    # deep enough for every pod of a burst of thousands, so none is dropped below
    # the recorder's per-pod rate limit (drops are counted, see fleet/client/events.py).
    event_queue: int = 100_000
    event_senders: int = 4
    percentage_of_nodes_to_score: int = 0  # 0: Kubernetes' adaptive default
    # VolumeBinding's pre-bind: how long to wait for a pod's claims to be bound
    # (kube-scheduler's bindTimeoutSeconds, 600 there) and how often to look.
    volume_bind_timeout: float = 60.0
    volume_poll_interval: float = 0.2


# What VolumeBinding reads besides claims: (apiVersion, plural, Scheduler handler).
# Informers start only for the kinds the server serves (discovery).
STORAGE_RESOURCES = (
    ("v1", "persistentvolumes", "on_pv"),
    ("storage.k8s.io/v1", "storageclasses", "on_storage_class"),
    ("storage.k8s.io/v1", "csinodes", "on_csinode"),
    ("storage.k8s.io/v1", "csidrivers", "on_csidriver"),
    ("storage.k8s.io/v1", "csistoragecapacities", "on_capacity"),
)


def _node_fingerprint(node: dict[str, Any]) -> Any:
    """What about a node can change a scheduling decision (not its heartbeats)."""
    status = node.get("status") or {}
    return (node.get("spec"), (node.get("metadata") or {}).get("labels"),
            status.get("allocatable") or status.get("capacity"))


class Scheduler:
    def __init__(self, client: Client, cfg: SchedulerConfig | None = None,
                 framework: Framework | None = None, *,
                 bind_clients: list[Client | FastConnection] | None = None,
                 event_clients: list[Client] | None = None) -> None:
        self.client = client
        # Binds go through their own single-connection clients: one shared httpx
        # pool rescans every connection per request and, past its keep-alive limit,
        # closes connections (a TLS handshake per bind) — at hundreds of binds per
        # second that cost more CPU than the scheduling itself.
        self._bind_clients = list(bind_clients or [])
        self.cfg = cfg or SchedulerConfig()
        self.events = EventRecorder(client, self.cfg.scheduler_name, queue_size=self.cfg.event_queue,
                                    senders=self.cfg.event_senders, sender_clients=list(event_clients or []))
        self.framework = framework or default_framework(self.cfg)
        self.snapshot = Snapshot()
        self.queue = SchedulingQueue(initial_backoff=self.cfg.initial_backoff,
                                     max_backoff=self.cfg.max_backoff,
                                     unschedulable_timeout=self.cfg.unschedulable_timeout)
        self.pending: dict[str, dict[str, Any]] = {}  # unbound pods we are responsible for
        self.assumed: dict[str, str] = {}  # pod key -> node, bound by us but not yet seen bound
        self._bind_slots = trio.Semaphore(self.cfg.parallel_binds)
        self._cycle_failures: dict[str, int] = {}  # pod key -> scheduling cycles that raised

    # -- informer handlers (synchronous: in-memory only) -----------------------
    def on_namespace(self, etype: str, old: dict[str, Any] | None,
                     new: dict[str, Any] | None) -> None:
        # Namespace labels decide which pods a namespaceSelector (pod affinity) covers.
        if etype == "DELETED":
            assert old is not None
            self.snapshot.remove_namespace(old["metadata"]["name"])
            return
        assert new is not None
        self.snapshot.set_namespace(new)
        if old is None or (old.get("metadata") or {}).get("labels") != \
                (new.get("metadata") or {}).get("labels"):
            self.queue.move_all()

    def on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            assert old is not None
            self.snapshot.remove_node(old["metadata"]["name"])
            return
        assert new is not None
        self.snapshot.set_node(new)
        if old is None or _node_fingerprint(old) != _node_fingerprint(new):
            self.queue.move_all()

    def on_pvc(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        # VolumeBinding reads claims; a claim appearing or binding can make a pod fit.
        if etype == "DELETED":
            assert old is not None
            self.snapshot.remove_pvc(pod_key(old))
        else:
            assert new is not None
            self.snapshot.set_pvc(new)
        self.queue.move_all()

    def _on_storage(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None,
                    set_: Any, remove: Any, key: Any) -> None:
        if etype == "DELETED":
            assert old is not None
            remove(key(old))
        else:
            assert new is not None
            set_(new)
        # A volume, class, driver or capacity appearing or changing can make a pod fit.
        self.queue.move_all()

    def on_pv(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._on_storage(etype, old, new, self.snapshot.set_pv, self.snapshot.remove_pv, _name)

    def on_storage_class(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._on_storage(etype, old, new, self.snapshot.set_storage_class,
                         self.snapshot.remove_storage_class, _name)

    def on_csinode(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._on_storage(etype, old, new, self.snapshot.set_csinode, self.snapshot.remove_csinode, _name)

    def on_csidriver(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._on_storage(etype, old, new, self.snapshot.set_csidriver, self.snapshot.remove_csidriver, _name)

    def on_capacity(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._on_storage(etype, old, new, self.snapshot.set_capacity, self.snapshot.remove_capacity, pod_key)

    def on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        assert pod is not None
        key = pod_key(pod)
        if etype == "DELETED":
            self.assumed.pop(key, None)
            self.pending.pop(key, None)
            self.queue.delete(key)
            self.events.forget(str((pod.get("metadata") or {}).get("uid") or ""))
            self._cycle_failures.pop(key, None)
            self.framework.nominate(pod, None)
            if (pod.get("spec") or {}).get("nodeName"):
                self.snapshot.remove_pod(key)
                self.queue.move_all()  # its resources are free again
            return
        assert new is not None
        bound = bool((new.get("spec") or {}).get("nodeName"))
        if key in self.assumed and not bound:
            return  # an older version than the one we just bound; keep the assumption
        self.assumed.pop(key, None)
        self.snapshot.set_pod(new)
        if bound or is_terminated(new):
            self.pending.pop(key, None)
            self.queue.delete(key)
            self.framework.nominate(new, None)
            if old is not None and not is_terminated(old) and is_terminated(new):
                self.queue.move_all()
            return
        self.framework.nominate(new, (new.get("status") or {}).get("nominatedNodeName"))
        if self._responsible_for(new):
            self.pending[key] = new
            self.queue.add(key, pod_priority(new))

    def _responsible_for(self, pod: dict[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (spec.get("schedulerName", DEFAULT_SCHEDULER_NAME) == self.cfg.scheduler_name
                and not (pod.get("metadata") or {}).get("deletionTimestamp")
                and not spec.get("schedulingGates"))

    # -- the loop ----------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            # Nodes first, so the first pods scheduled see every node.
            me = self.cfg.scheduler_name
            await nursery.start(Informer(self.client, "v1", "nodes", self.on_node, component=me).run)
            await nursery.start(Informer(self.client, "v1", "namespaces", self.on_namespace, component=me).run)
            await nursery.start(Informer(self.client, "v1", "persistentvolumeclaims", self.on_pvc,
                                         component=me).run)
            self.snapshot.pvcs_synced = True  # VolumeBinding may judge claims from now on
            for api_version, plural, handler in await self._served(STORAGE_RESOURCES):
                await nursery.start(Informer(self.client, api_version, plural, getattr(self, handler),
                                             component=me).run)
                if plural == "persistentvolumes":
                    self.snapshot.pvs_synced = True  # ... and match volumes to nodes
            await nursery.start(Informer(self.client, "v1", "pods", self.on_pod,
                                         field_selector=ACTIVE_PODS, component=me).run)
            await nursery.start(self.events.run)
            task_status.started()
            while True:
                await self.schedule_one(nursery)

    async def _served(self, wanted: tuple[tuple[str, str, str], ...]) -> list[tuple[str, str, str]]:
        """The entries of `wanted` whose resource the server serves (discovery); none if
        discovery fails — VolumeBinding then judges claims only, as without the kinds."""
        try:
            served = {(r.group, r.version, r.name) for r in await self.client.discover()}
        except (ApiException, httpx.HTTPError, OSError, AttributeError) as e:
            log.warning("discovery failed (%s): volume binding checks claims only", e)
            return []
        out = []
        for api_version, plural, handler in wanted:
            group, _, version = api_version.rpartition("/")
            if (group, version, plural) in served:
                out.append((api_version, plural, handler))
            else:
                log.info("the server does not serve %s/%s: VolumeBinding goes without it", api_version, plural)
        return out

    async def schedule_one(self, nursery: trio.Nursery) -> None:
        key = await self.queue.pop()
        pod = self.pending.get(key)
        if pod is None:
            self.queue.delete(key)
            return
        try:
            await self._schedule_pod(nursery, key, pod)
        except Exception as e:  # noqa: BLE001 - one pod's failure must not stop scheduling
            n = self._cycle_failures[key] = self._cycle_failures.get(key, 0) + 1
            object_failed(self.cfg.scheduler_name, "Pod", key, e, logger=log,
                          action=f"scheduling cycle failed ({n}); retrying with back-off",
                          level=logging.WARNING if n <= 5 else logging.DEBUG)
            if self.assumed.pop(key, None) is not None:
                with contextlib.suppress(Exception):  # the pod broke the snapshot once already
                    self.snapshot.remove_pod(key)
            self.queue.add_backoff(key)
        else:
            self._cycle_failures.pop(key, None)

    async def _schedule_pod(self, nursery: trio.Nursery, key: str, pod: dict[str, Any]) -> None:
        try:
            result = self.framework.schedule(pod, self.snapshot)
        except FitError as e:
            nomination = self.framework.post_filter(pod, self.snapshot, e)
            # Parked before any await, so a cluster event arriving while the
            # event is written still moves the pod on.
            self.queue.add_unschedulable(key)
            message = str(e)
            if nomination is not None:
                await self.preempt(pod, nomination)
            await self.record_unschedulable(pod, message)
            return
        # A shallow copy with a new spec: snapshot objects are never mutated, so the
        # rest can be shared (a deep copy per pod was a visible share of a cycle).
        assumed = {**pod, "spec": {**pod["spec"], "nodeName": result.node}}
        self.snapshot.set_pod(assumed)
        self.assumed[key] = result.node
        state = result.state
        if state is not None and self.framework.reservers:
            st = self.framework.reserve(state, pod, result.node)
            if not st.ok:
                self._forget_assumed(key, result.node)
                self.queue.add_backoff(key)
                await self.record_unschedulable(pod, "; ".join(st.reasons), reason="SchedulerError")
                return
        if self.framework.pre_binders_for(state):
            # Waiting for volumes can take long: no bind slot is held meanwhile.
            assert state is not None
            nursery.start_soon(self._pre_bind_then_bind, key, pod, result.node, state)
            return
        await self._bind_slots.acquire()
        client = self._bind_clients.pop() if self._bind_clients else self.client
        nursery.start_soon(self._bind, key, pod, result.node, client)

    def _forget_assumed(self, key: str, node: str) -> None:
        if self.assumed.get(key) == node:
            self.assumed.pop(key, None)
            self.snapshot.remove_pod(key)

    async def _pre_bind_then_bind(self, key: str, pod: dict[str, Any], node: str,
                                  state: CycleState) -> None:
        """The pre-bind plugins (VolumeBinding: bind volumes, wait for the claims), then
        the Binding.  A failure undoes the reservation and retries the pod after back-off,
        with a FailedScheduling event saying why (kube-scheduler's handleBindingCycleError)."""
        handle = BindHandle(self.client, self.snapshot, timeout=self.cfg.volume_bind_timeout,
                            poll_interval=self.cfg.volume_poll_interval,
                            pod_exists=lambda: key in self.pending)
        try:
            st = await self.framework.pre_bind(state, pod, node, handle)
        except Exception as e:  # noqa: BLE001 - one pod's failure must not stop the scheduler
            log.warning("pre-bind of %s on %s raised: %r", key, node, e)
            st = Status.error(f"running PreBind plugins: {e}")
        if not st.ok:
            log.info("pre-binding %s to %s failed: %s", key, node, "; ".join(st.reasons))
            self.framework.unreserve(state, pod, node)
            self._forget_assumed(key, node)
            if key in self.pending:
                self.queue.add_backoff(key)
                await self.record_unschedulable(pod, "; ".join(st.reasons), reason="SchedulerError")
            return
        await self._bind_slots.acquire()
        client = self._bind_clients.pop() if self._bind_clients else self.client
        await self._bind(key, pod, node, client, state)

    async def _bind(self, key: str, pod: dict[str, Any], node: str,
                    client: Client | FastConnection | None = None,
                    state: CycleState | None = None) -> None:
        md = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": md["name"], "namespace": md["namespace"], "uid": md.get("uid")},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        c = client or self.client
        try:
            if isinstance(c, FastConnection):
                await c.post_json(f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/binding",
                                  body)
            else:
                await c.create("v1", "pods", body, md["namespace"], name=md["name"],
                               subresource="binding")
        except (ApiException, httpx.HTTPError, OSError, trio.TooSlowError) as e:
            log.info("binding %s to %s failed: %s", key, node, e)
            self._forget_assumed(key, node)
            if isinstance(e, ApiException) and e.code in (404, 409):
                # Gone, or bound by someone else: the informer brings the truth.
                self.queue.delete(key)
            else:
                self.queue.add_backoff(key)
            return
        finally:
            if c is not self.client:
                self._bind_clients.append(c)
            self._bind_slots.release()
            if state is not None:
                # Bound or not, the promises end here: the informers show the truth.
                self.framework.unreserve(state, pod, node)
        self.queue.done(key)
        self.pending.pop(key, None)
        self.events.record(pod, "Normal", "Scheduled",
                         f"Successfully assigned {md['namespace']}/{md['name']} to {node}")

    # -- preemption --------------------------------------------------------------
    async def preempt(self, pod: dict[str, Any], nomination: Nomination) -> None:
        """Nominate `pod` to the node and delete the victims (kube-scheduler's
        prepareCandidate): victims are deleted gracefully, each with a Preempted event."""
        md = pod["metadata"]
        key = pod_key(pod)
        nominated = {**pod, "status": {**(pod.get("status") or {}),
                                       "nominatedNodeName": nomination.node}}
        self.framework.nominate(nominated, nomination.node)
        self.pending[key] = nominated
        try:
            await self.client.patch("v1", "pods", md["name"],
                                    {"status": {"nominatedNodeName": nomination.node}},
                                    STRATEGIC_MERGE_PATCH, md["namespace"], subresource="status")
        except (ApiException, httpx.HTTPError) as e:
            log.info("nominating %s to %s failed: %s", key, nomination.node, e)
        for victim in nomination.victims:
            vmd = victim["metadata"]
            self.events.record(victim, "Normal", "Preempted",
                             f"Preempted by pod {md.get('uid')} on node {nomination.node}")
            try:
                await self.client.delete("v1", "pods", vmd["name"], vmd["namespace"],
                                         body={"preconditions": {"uid": vmd.get("uid")}})
            except (ApiException, httpx.HTTPError) as e:
                log.info("preempting %s failed: %s", pod_key(victim), e)
        log.info("pod %s preempts %d pod(s) on %s", key, len(nomination.victims), nomination.node)

    # -- reporting -------------------------------------------------------------
    async def record_unschedulable(self, pod: dict[str, Any], message: str,
                                   reason: str = "Unschedulable") -> None:
        """A FailedScheduling event (repeats counted on one event) and PodScheduled=False
        (reason Unschedulable, or SchedulerError when binding failed)."""
        key = pod_key(pod)
        md = pod["metadata"]
        # The recorder correlates a repeat of the same message into one event's count.
        self.events.record(pod, "Warning", "FailedScheduling", message)
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message") == message:
                return
        condition = {"type": "PodScheduled", "status": "False", "reason": reason,
                     "message": message, "lastProbeTime": None,
                     "lastTransitionTime": meta.now_rfc3339()}
        try:
            await self.client.patch("v1", "pods", md["name"], {"status": {"conditions": [condition]}},
                                    STRATEGIC_MERGE_PATCH, md["namespace"], subresource="status")
        except (ApiException, httpx.HTTPError) as e:
            log.info("setting PodScheduled on %s failed: %s", key, e)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def default_framework(cfg: SchedulerConfig) -> Framework:
    """The default profile: the default plugins with kube-scheduler's weights, and preemption."""
    return Framework([*default_plugins(), DefaultPreemption()], weights=default_weights(),
                     percentage_of_nodes_to_score=cfg.percentage_of_nodes_to_score)


async def run(config: ClientConfig, cfg: SchedulerConfig | None = None, *,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the scheduler against the API at `config` until cancelled.

    `started` fires once both informers have listed, i.e. when the scheduler
    knows every node and pending pod.  The client is owned (and closed) here.
    """
    cfg = cfg or SchedulerConfig()

    def single() -> Client:
        transport = httpx.AsyncHTTPTransport(
            verify=ssl_context(config),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        return Client(config, user_agent="fleet-scheduler", transport=transport)

    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(Client(config, user_agent="fleet-scheduler"))
        # Binds are the scheduler's hottest requests: a bare HTTP/1.1 connection each
        # (fleet.client.fast) instead of httpx.
        binds: list[Client | FastConnection] = [
            await stack.enter_async_context(FastConnection(config, user_agent="fleet-scheduler"))
            for _ in range(cfg.parallel_binds)]
        events = [await stack.enter_async_context(single()) for _ in range(cfg.event_senders)]
        await Scheduler(client, cfg, bind_clients=binds, event_clients=events).run(
            task_status=task_status)
