"""Node lifecycle: notice dead nodes, taint them, and evict their pods.

This is kube-controller-manager's node lifecycle controller together with its
taint-based eviction (the NoExecuteTaintManager, now `taint-eviction-controller`)
and the orphan part of the pod garbage collector, in one package:

    informers (nodes, kube-node-lease leases, pods)
        │ on_node / on_lease: note *when we saw* a heartbeat (NodeHealth.probe)
        │ on_pod / NoExecute taint changes: (re)schedule evictions
        ▼
    monitor pass (at the next staleness deadline, at least every monitor_period)
        1. judge every node: stale = no heartbeat seen for the grace period   (plan_node)
        2. zone states → full/partial disruption → tainting rates          (plan_disruption)
        3. per node: conditions → Unknown, TaintNodesByCondition NoSchedule taints,
           unreachable / not-ready NoExecute taint (added through the rate-limited
           per-zone queue, swapped or removed at once)                     (plan_taints)
           pods on a stale node → Ready=False (MarkPodsNotReady)
        4. pods bound to a node that is gone for a quarantine period → Failed + deleted
    tainter: per-zone token buckets drain the NoExecute queue
    evictor: deletes each pod when its eviction time comes                 (eviction_deadline)

**Liveness is judged by observation time, as Kubernetes does.**  A node is
alive while we keep *seeing changes* in its Lease's `renewTime` or its Ready
condition's `lastHeartbeatTime`; the time of the last change we saw
(`trio.current_time()`, monotonic) plus the grace period is its deadline.  The
node's own timestamps are never compared with our clock, so clock skew between a
node and the server cannot make a healthy node look dead.  The same rule gives
every node one full grace period after the controller (re)starts: the first
sighting counts as a heartbeat, so stale leases left over while the server was
down are not held against anybody.  A node that never posted a Ready condition
gets the (longer) startup grace period.

**Taint eviction counts from the taint's `timeAdded`** (wall clock): a pod
tolerating a NoExecute taint for `tolerationSeconds` stays that long after the
taint was added, and no longer, even across controller restarts.  (Kubernetes'
taint manager counts from when *it* first saw the taint, so its timer restarts
with the controller.)  `timeAdded` has one-second precision, so for taints we
added ourselves — or saw appear in the same second — our own precise
observation is used instead.  A taint without `timeAdded` counts from when we
first saw it.  Untolerated NoExecute taints, or `tolerationSeconds <= 0`,
evict at once; an infinite toleration keeps the pod.

**Rate limits and disruption, as Kubernetes.**  Evictions are throttled where
Kubernetes throttles them: adding the NoExecute taint to a node goes through a
per-zone token bucket (`eviction_rate` nodes per second, burst 1 — the first
dead node is tainted at once, the next after 1/rate seconds).  Deleting the pods
of a tainted node is not rate limited (a small worker pool does it).  Zones come
from the `topology.kubernetes.io/region`/`zone` labels.  A zone where at least
`unhealthy_zone_threshold` (55%) of the nodes — and more than two — are not
Ready is *partially disrupted*: tainting slows to `secondary_eviction_rate` if
the zone is larger than `large_cluster_size_threshold`, and stops otherwise.
When *every* zone is fully disrupted (no Ready node anywhere — typically the
network or the control plane was at fault, not the nodes), the controller
removes its NoExecute taints everywhere and evicts nothing until some node is
Ready again; then every node gets a fresh grace period.  Note the consequence
Kubernetes shares: a single-node cluster never evicts on node failure.

Deviations from Kubernetes, on purpose:

- the NoExecute `unreachable` taint follows our staleness judgment, not the
  Ready condition alone: a node whose Lease is renewed again loses it at once,
  even before its agent re-posts Ready=True (Fleet's agent re-posts status only
  every 20 s); the NoSchedule `unreachable` taint stays until Ready is posted;
- the monitor wakes at the earliest staleness deadline instead of polling every
  `--node-monitor-period` only, and taints in the same pass it marks a node
  Unknown (Kubernetes taints one pass later);
- per taint, the toleration's deadline is counted from that taint's
  `timeAdded`, and the earliest deadline wins (Kubernetes takes the smallest
  `tolerationSeconds` and counts it from its first sighting);
- the orphan quarantine of the pod GC is the monitor grace period (Kubernetes:
  a fixed 40 s, the same as the default grace period);
- a node that has not posted Ready yet and is within its startup grace does
  not count in its zone's health (Kubernetes counts it as not Ready; Fleet's
  agent creates its Node before posting status, so a one-node server would
  enter and leave full disruption mode at every start).

The package, along those seams (pure decisions apart from the I/O loop):

    common.py      configuration, taint keys, zone labels, small accessors
    health.py      heartbeats and conditions: observe_node / observe_lease, plan_node
    taints.py      TaintNodesByCondition and the NoExecute decision: plan_taints
    eviction.py    taint-based eviction: eviction_deadline, pod_not_ready_patch
    zones.py       disruption states and rates: plan_disruption, TokenBucket
    cluster.py     ClusterAPI (the writes) and ApiCluster over the API client
    controller.py  NodeLifecycleController: handlers, monitor, tainter, evictor, pod GC

The first five are pure and tested table-driven; `NodeLifecycleController` is the
I/O around them, written so that its loops run under Trio's MockClock against a
fake `ClusterAPI`.  `NodeLifecycle` (here) is its controller-manager face: it feeds
the controller from the manager's shared informers (nodes, kube-node-lease Leases,
pods) and runs its loops, supervised by the manager like every other controller.
"""

from __future__ import annotations

import trio

from fleet.client import ClientConfig
from fleet.controllers.nodelifecycle.cluster import ApiCluster
from fleet.controllers.nodelifecycle.common import LEASE_NAMESPACE, NodeLifecycleConfig
from fleet.controllers.nodelifecycle.controller import NodeLifecycleController
from fleet.controllers.runtime import Context, Manager


class NodeLifecycle:
    """The node lifecycle controller as the controller manager runs it (`nodelifecycle`
    in --controllers): fed by the manager's shared informers, its loops supervised by
    the manager (a crash restarts them with back-off, the other controllers go on)."""

    name = "nodelifecycle"

    def __init__(self, cfg: NodeLifecycleConfig | None = None) -> None:
        self.cfg = cfg or NodeLifecycleConfig()
        self.controller: NodeLifecycleController | None = None

    def setup(self, ctx: Context) -> None:
        """Wire the handlers (before the informers start).

        The handlers do not depend on the order the informers list in: a pod seen
        before its node is (re)evaluated when the node arrives."""
        self.controller = ctl = NodeLifecycleController(ApiCluster(ctx.client), self.cfg)
        ctx.informers.informer("v1", "nodes").add_handler(ctl.on_node)
        ctx.informers.informer("coordination.k8s.io/v1", "leases",
                               field_selector=f"metadata.namespace={LEASE_NAMESPACE}").add_handler(ctl.on_lease)
        ctx.informers.informer("v1", "pods").add_handler(ctl.on_pod)

    async def run(self, ctx: Context) -> None:
        assert self.controller is not None, "setup() first"
        await self.controller.run_loops()


async def run(config: ClientConfig, cfg: NodeLifecycleConfig | None = None, *,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Only the node lifecycle controller, in a manager of its own, until cancelled
    (`fleet server` runs it inside its controller manager instead)."""
    await Manager([NodeLifecycle(cfg)]).run(config, task_status=task_status)


__all__ = ["NodeLifecycle", "NodeLifecycleConfig", "run"]
