"""Node lifecycle: notice dead nodes, taint them, and evict their pods.

This is kube-controller-manager's node lifecycle controller together with its
taint-based eviction (the NoExecuteTaintManager, now `taint-eviction-controller`)
and the orphan part of the pod garbage collector, in one module:

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

`plan_node`, `plan_taints`, `plan_disruption`, `eviction_deadline`,
`observe_node`, `observe_lease`, `TokenBucket` and friends are pure and tested
table-driven; `NodeLifecycleController` is the I/O around them, written so
that its loops run under Trio's MockClock against a fake `ClusterAPI`.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx
import trio

from fleet._core.supervise import object_failed
from fleet.api import meta
from fleet.api.tolerations import toleration_matches
from fleet.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiException, Client, ClientConfig
from fleet.client.events import EventRecorder
from fleet.client.informer import Informer, object_key

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"

TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NO_EXECUTE = "NoExecute"
NO_SCHEDULE = "NoSchedule"
# The NoExecute taints this controller owns (and may remove).
CONTROLLER_NO_EXECUTE = (TAINT_UNREACHABLE, TAINT_NOT_READY)

# TaintNodesByCondition: condition type -> status -> NoSchedule taint key.
CONDITION_TAINTS: dict[str, dict[str, str]] = {
    "Ready": {"False": TAINT_NOT_READY, "Unknown": TAINT_UNREACHABLE},
    "MemoryPressure": {"True": "node.kubernetes.io/memory-pressure"},
    "DiskPressure": {"True": "node.kubernetes.io/disk-pressure"},
    "NetworkUnavailable": {"True": "node.kubernetes.io/network-unavailable"},
    "PIDPressure": {"True": "node.kubernetes.io/pid-pressure"},
}
MANAGED_NO_SCHEDULE = frozenset({TAINT_UNSCHEDULABLE} | {k for m in CONDITION_TAINTS.values()
                                                         for k in m.values()})

# The conditions set to Unknown when a node goes silent (NetworkUnavailable is
# the network plugin's, not the kubelet's, so it is left alone — as in k8s).
KUBELET_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
LEGACY_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
LEGACY_REGION_LABEL = "failure-domain.beta.kubernetes.io/region"
EXCLUDE_DISRUPTION_LABEL = "node.kubernetes.io/exclude-disruption"

STATE_INITIAL = "Initial"
STATE_NORMAL = "Normal"
STATE_PARTIAL = "PartialDisruption"
STATE_FULL = "FullDisruption"

NODE_CONTROLLER = "node-controller"
TAINT_EVICTION_CONTROLLER = "taint-eviction-controller"
POD_GC = "pod-garbage-collector"

# eviction_deadline's answer for "now": an untolerated taint.
EVICT_NOW = -math.inf


@dataclass
class NodeLifecycleConfig:
    """Kubernetes' kube-controller-manager flags of the same names (seconds, nodes/s)."""

    monitor_grace_period: float = 40.0
    startup_grace_period: float = 60.0
    # The longest the monitor sleeps without a reason (retries, periodic re-checks).
    monitor_period: float = 5.0
    eviction_rate: float = 0.1
    secondary_eviction_rate: float = 0.01
    unhealthy_zone_threshold: float = 0.55
    large_cluster_size_threshold: int = 50
    # Pods bound to a missing node are deleted after this long (default: the grace period).
    orphan_quarantine: float | None = None
    eviction_workers: int = 8
    write_concurrency: int = 16
    # After an informer event wakes the monitor, wait this long so a burst is one pass.
    coalesce: float = 0.05
    retry_backoff: float = 1.0

    @property
    def quarantine(self) -> float:
        return self.monitor_grace_period if self.orphan_quarantine is None else self.orphan_quarantine


# ---------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------

rfc3339 = meta.format_time  # metav1.Time of a wall-clock time


def parse_time(value: Any) -> float | None:
    """An RFC 3339 timestamp (with or without fraction) as a Unix time; None if unparsable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return t.timestamp()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv is not None else None


def _rv_int(obj: Mapping[str, Any]) -> int:
    try:
        return int(_rv(obj) or -1)
    except ValueError:
        return -1


def get_condition(obj: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def ready_status(node: Mapping[str, Any]) -> str | None:
    """"True", "False", "Unknown", or None when the node never posted Ready."""
    c = get_condition(node, "Ready")
    return str(c.get("status")) if c is not None else None


def node_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]


def no_execute_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node_taints(node) if t.get("effect") == NO_EXECUTE]


def zone_key(node: Mapping[str, Any]) -> str:
    """Kubernetes' GetZoneKey: region and zone joined, "" when the node has neither."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    region = labels.get(REGION_LABEL) or labels.get(LEGACY_REGION_LABEL) or ""
    zone = labels.get(ZONE_LABEL) or labels.get(LEGACY_ZONE_LABEL) or ""
    if not region and not zone:
        return ""
    return f"{region}:\x00:{zone}"


def excluded_from_disruption(node: Mapping[str, Any]) -> bool:
    return EXCLUDE_DISRUPTION_LABEL in ((node.get("metadata") or {}).get("labels") or {})


def pod_key(pod: Mapping[str, Any]) -> str:
    return object_key(dict(pod))


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_tolerations(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]


# ---------------------------------------------------------------------------
# Node health: when did we last see a sign of life?
# ---------------------------------------------------------------------------

@dataclass
class NodeHealth:
    """What the controller remembers about a node between passes.

    `probe` is *our* (trio, monotonic) time of the last heartbeat we saw —
    a change of the Lease's renewTime or of Ready's lastHeartbeatTime — never
    the node's own timestamp.
    """

    probe: float
    heartbeat: str | None = None  # Ready.lastHeartbeatTime as last seen
    renew: str | None = None  # Lease spec.renewTime as last seen
    stale: bool = False  # the last monitor pass judged the node silent
    judged: bool = False  # the monitor has passed judgment once (start-up reset done)


def _heartbeat(node: Mapping[str, Any]) -> str | None:
    c = get_condition(node, "Ready")
    hb = c.get("lastHeartbeatTime") if c is not None else None
    return str(hb) if hb else None


def observe_node(health: NodeHealth | None, node: Mapping[str, Any], now: float, *,
                 renew: str | None = None) -> NodeHealth:
    """The node's health after seeing `node` at `now` (k8s tryUpdateNodeHealth's bookkeeping).

    The first sighting counts as a heartbeat: that is what gives every node one
    grace period after the controller starts.  `renew` is the node's Lease
    renewTime if the Lease was seen before the node.
    """
    hb = _heartbeat(node)
    if health is None:
        return NodeHealth(probe=now, heartbeat=hb, renew=renew)
    if hb is not None and hb != health.heartbeat:
        return replace(health, probe=now, heartbeat=hb)
    return health


def observe_lease(health: NodeHealth, renew_time: str | None, now: float) -> NodeHealth:
    """A Lease renewal is a heartbeat.  Any *change* counts (not only a later
    time), so a node whose clock stepped back is not declared dead for it."""
    if renew_time and renew_time != health.renew:
        return replace(health, probe=now, renew=renew_time)
    return health


def grace_period(node: Mapping[str, Any], cfg: NodeLifecycleConfig) -> float:
    """A node that never posted Ready is still starting: it gets the startup grace."""
    return cfg.monitor_grace_period if get_condition(node, "Ready") is not None else cfg.startup_grace_period


def is_stale(health: NodeHealth, node: Mapping[str, Any], now: float, cfg: NodeLifecycleConfig) -> bool:
    return now - health.probe >= grace_period(node, cfg)


def unknown_conditions(node: Mapping[str, Any], stamp: str) -> list[dict[str, Any]] | None:
    """The node's conditions with the kubelet's ones set to Unknown; None if already so.

    Kubernetes' wording and reasons: NodeStatusUnknown / "Kubelet stopped
    posting node status." for a condition the node had, NodeStatusNeverUpdated
    for one it never posted (with lastHeartbeatTime = the node's creation).
    """
    conds = copy.deepcopy([c for c in (node.get("status") or {}).get("conditions") or []
                           if isinstance(c, dict)])
    by_type = {c.get("type"): c for c in conds}
    changed = False
    for ctype in KUBELET_CONDITIONS:
        c = by_type.get(ctype)
        if c is None:
            conds.append({"type": ctype, "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                          "message": "Kubelet never posted node status.",
                          "lastHeartbeatTime": (node.get("metadata") or {}).get("creationTimestamp"),
                          "lastTransitionTime": stamp})
            changed = True
        elif c.get("status") != "Unknown":
            c.update({"status": "Unknown", "reason": "NodeStatusUnknown",
                      "message": "Kubelet stopped posting node status.", "lastTransitionTime": stamp})
            changed = True
    return conds if changed else None


@dataclass(frozen=True)
class NodePlan:
    """The monitor's judgment of one node at one instant."""

    stale: bool
    ready: str | None  # Ready's status after the judgment ("Unknown" when stale)
    conditions: list[dict[str, Any]] | None  # new conditions to write, or None
    no_execute: str | None  # the controller NoExecute taint the node should carry, if any


def plan_node(node: Mapping[str, Any], health: NodeHealth, now: float, stamp: str,
              cfg: NodeLifecycleConfig, *, all_disrupted: bool = False) -> NodePlan:
    """Judge one node: silent for its grace period → Unknown and unreachable;
    reporting Ready=False → not-ready; otherwise no NoExecute taint.  While
    every zone is fully disrupted no NoExecute taint is wanted anywhere."""
    stale = is_stale(health, node, now, cfg)
    conditions = unknown_conditions(node, stamp) if stale else None
    ready = "Unknown" if stale else ready_status(node)
    if all_disrupted:
        target = None
    elif stale:
        target = TAINT_UNREACHABLE
    elif ready == "False":
        target = TAINT_NOT_READY
    else:
        target = None
    return NodePlan(stale=stale, ready=ready, conditions=conditions, no_execute=target)


# ---------------------------------------------------------------------------
# Taints
# ---------------------------------------------------------------------------

def condition_taint_keys(node: Mapping[str, Any]) -> list[str]:
    """The NoSchedule taints the node's conditions and spec.unschedulable call for (TaintNodesByCondition)."""
    keys: list[str] = []
    for c in (node.get("status") or {}).get("conditions") or []:
        if not isinstance(c, dict):
            continue
        key = CONDITION_TAINTS.get(str(c.get("type")), {}).get(str(c.get("status")))
        if key and key not in keys:
            keys.append(key)
    if (node.get("spec") or {}).get("unschedulable") is True:
        keys.append(TAINT_UNSCHEDULABLE)
    return keys


@dataclass(frozen=True)
class TaintPlan:
    taints: list[dict[str, Any]] | None  # the node's new spec.taints, or None if unchanged
    queue_no_execute: bool  # the NoExecute taint must be added through the rate-limited queue


def plan_taints(node: Mapping[str, Any], target: str | None, stamp: str, *,
                reset: bool = False) -> TaintPlan:
    """The node's taints after TaintNodesByCondition and the NoExecute decision.

    `node` carries the conditions as they will be after this pass.  Taints
    someone else owns are kept as they are, in order.  The NoExecute taint is
    *removed* at once, *swapped* (unreachable ↔ not-ready) at once, but
    *added* only through the rate-limited queue, as in Kubernetes.  `reset`
    drops our NoExecute taints left from before the controller started
    (Kubernetes' markNodeAsReachable for newly seen nodes): they are re-added,
    with a fresh timeAdded, only once the node is judged again.
    """
    current = node_taints(node)
    wanted_ns = condition_taint_keys(node)
    out: list[dict[str, Any]] = []
    have_ns: set[str] = set()
    for t in current:
        key, effect = t.get("key"), t.get("effect")
        if effect == NO_SCHEDULE and key in MANAGED_NO_SCHEDULE:
            if key in wanted_ns and key not in have_ns:
                out.append(t)
                have_ns.add(str(key))
            continue
        if effect == NO_EXECUTE and key in CONTROLLER_NO_EXECUTE:
            continue  # decided below
        out.append(t)
    out.extend({"key": k, "effect": NO_SCHEDULE} for k in wanted_ns if k not in have_ns)

    present = [t for t in current if t.get("effect") == NO_EXECUTE and t.get("key") in CONTROLLER_NO_EXECUTE]
    if reset:
        present = []
    queue = False
    if target is not None:
        if present and all(t.get("key") == target for t in present):
            out.append(present[0])  # already right: keep its timeAdded
        elif present:
            out.append({"key": target, "effect": NO_EXECUTE, "timeAdded": stamp})  # swap at once
        else:
            queue = True
    return TaintPlan(taints=None if out == current else out, queue_no_execute=queue)


def with_no_execute(node: Mapping[str, Any], target: str, stamp: str) -> list[dict[str, Any]] | None:
    """The node's taints with `target` as the only controller NoExecute taint (None if so already)."""
    current = node_taints(node)
    out = [t for t in current if not (t.get("effect") == NO_EXECUTE and t.get("key") in CONTROLLER_NO_EXECUTE)]
    kept = [t for t in current if t.get("effect") == NO_EXECUTE and t.get("key") == target]
    out.append(kept[0] if kept else {"key": target, "effect": NO_EXECUTE, "timeAdded": stamp})
    return None if out == current else out


# ---------------------------------------------------------------------------
# Taint eviction
# ---------------------------------------------------------------------------

def eviction_deadline(tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]],
                      since: Callable[[Mapping[str, Any]], float]) -> float | None:
    """When a pod with `tolerations` must leave a node with NoExecute `taints`.

    Returns EVICT_NOW if some taint is not tolerated, None if every taint is
    tolerated forever, else the wall-clock time: for each taint, the first
    matching toleration's `tolerationSeconds` (<= 0 meaning at once, absent
    meaning forever) counted from `since(taint)`; the earliest wins.  "First
    matching" is Kubernetes' GetMatchingTolerations.
    """
    tols = [dict(t) for t in tolerations]
    deadline: float | None = None
    for taint in taints:
        if taint.get("effect") != NO_EXECUTE:
            continue
        used = next((t for t in tols if toleration_matches(t, dict(taint))), None)
        if used is None:
            return EVICT_NOW
        secs = used.get("tolerationSeconds")
        if isinstance(secs, bool) or not isinstance(secs, int | float):
            continue  # tolerated forever
        at = since(taint) + max(float(secs), 0.0)
        deadline = at if deadline is None else min(deadline, at)
    return deadline


def pod_not_ready_patch(pod: Mapping[str, Any], stamp: str) -> dict[str, Any] | None:
    """MarkPodsNotReady: Ready=False for a pod whose Ready condition is not False already.

    A pod without a Ready condition is left alone, as in Kubernetes.  The
    patch carries the pod's resourceVersion, so it never overwrites a status
    the node wrote after we looked.
    """
    c = get_condition(pod, "Ready")
    if c is None or c.get("status") == "False":
        return None
    return {"metadata": {"resourceVersion": _rv(pod)},
            "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": stamp}]}}


# ---------------------------------------------------------------------------
# Zones, disruption and rate limits
# ---------------------------------------------------------------------------

def compute_zone_state(statuses: Iterable[str | None], threshold: float) -> tuple[int, str]:
    """Kubernetes' ComputeZoneState: (not-ready count, state) for a zone's Ready statuses."""
    ready = not_ready = 0
    for s in statuses:
        if s == "True":
            ready += 1
        else:
            not_ready += 1
    if ready == 0 and not_ready > 0:
        return not_ready, STATE_FULL
    if not_ready > 2 and not_ready / (not_ready + ready) >= threshold:
        return not_ready, STATE_PARTIAL
    return not_ready, STATE_NORMAL


def zone_rate(state: str, size: int, cfg: NodeLifecycleConfig) -> float:
    """How fast nodes of a zone in `state` may be tainted NoExecute (nodes per second)."""
    if state == STATE_PARTIAL:
        return cfg.secondary_eviction_rate if size > cfg.large_cluster_size_threshold else 0.0
    # Normal, a fresh zone, and a fully disrupted zone while others are healthy
    # (that zone is what failed: move its pods elsewhere) all use the normal rate.
    return cfg.eviction_rate


@dataclass(frozen=True)
class DisruptionPlan:
    states: dict[str, str]
    rates: dict[str, float]
    all_disrupted: bool
    entered: bool  # every zone just became fully disrupted: remove NoExecute taints everywhere
    exited: bool  # some node is Ready again after that: give every node a fresh grace period


def plan_disruption(zone_statuses: Mapping[str, list[str | None]], previous: Mapping[str, str],
                    cfg: NodeLifecycleConfig) -> DisruptionPlan:
    """Kubernetes' handleDisruption over one pass's Ready statuses, per zone."""
    if not zone_statuses:
        # No node counts (none at all, or only excluded and registering ones): no
        # disruption to speak of, and nothing to stop.
        return DisruptionPlan({}, {}, False, False, False)
    new = {z: compute_zone_state(s, cfg.unhealthy_zone_threshold)[1] for z, s in zone_statuses.items()}
    all_are = all(s == STATE_FULL for s in new.values())
    # Zones seen for the first time start Initial, so they count as "not fully
    # disrupted before" (a cluster's first node coming up NotReady enters the mode).
    prev = {z: previous.get(z, STATE_INITIAL) for z in zone_statuses}
    all_were = all(s == STATE_FULL for s in prev.values())
    sizes = {z: len(s) for z, s in zone_statuses.items()}
    if all_are and all_were:
        return DisruptionPlan(dict(prev), {z: 0.0 for z in new}, True, False, False)
    if all_are:
        return DisruptionPlan({z: STATE_FULL for z in new}, {z: 0.0 for z in new}, True, True, False)
    rates = {z: zone_rate(s, sizes[z], cfg) for z, s in new.items()}
    return DisruptionPlan(new, rates, False, False, all_were)


class TokenBucket:
    """client-go's token bucket rate limiter: `rate` tokens a second, `burst` at most, starts full.

    A rate of 0 never grants (Kubernetes swaps in a "never" limiter to stop evictions).
    """

    def __init__(self, rate: float, now: float, burst: int = 1) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if self.rate > 0 and now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def try_take(self, now: float) -> bool:
        self._refill(now)
        if self.rate <= 0 or self.tokens < 1.0 - 1e-9:
            return False
        self.tokens = max(0.0, self.tokens - 1.0)
        return True

    def next_time(self, now: float) -> float | None:
        """When the next token is there (None: never, at rate 0)."""
        self._refill(now)
        if self.rate <= 0:
            return None
        if self.tokens >= 1.0 - 1e-9:
            return now
        return now + (1.0 - self.tokens) / self.rate

    def refund(self) -> None:
        """Return a token whose work did not happen (a failed write)."""
        self.tokens = min(float(self.burst), self.tokens + 1.0)

    def set_rate(self, rate: float, now: float) -> None:
        if rate == self.rate:
            return
        self._refill(now)
        if self.rate <= 0 < rate:
            self.tokens = float(self.burst)  # as k8s' SwapLimiter: a fresh, full bucket
        self.rate = rate


# ---------------------------------------------------------------------------
# I/O
# ---------------------------------------------------------------------------

class ClusterAPI(Protocol):
    """The writes the controller makes (ApiException 404/409 on failure)."""

    async def get_node(self, name: str) -> dict[str, Any] | None: ...

    async def patch_node(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]: ...

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def delete_pod(self, namespace: str, name: str, uid: str | None, *,
                         grace_period: int | None = None) -> None: ...

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None: ...


class ApiCluster:
    """`ClusterAPI` over the real API client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.client.get_object("v1", "nodes", name)
        except ApiException as e:
            if e.code == 404:
                return None
            raise

    async def patch_node(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        return await self.client.patch("v1", "nodes", name, patch, MERGE_PATCH,
                                       subresource="status" if status else None)

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.client.patch("v1", "pods", name, patch, STRATEGIC_MERGE_PATCH, namespace,
                                       subresource="status")

    async def delete_pod(self, namespace: str, name: str, uid: str | None, *,
                         grace_period: int | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        await self.client.delete("v1", "pods", name, namespace, body=body)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        await self.client.create("v1", "events", event, namespace)

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self.client.patch("v1", "events", name, patch, MERGE_PATCH, namespace)


RETRYABLE = (ApiException, httpx.HTTPError, OSError)


class _EventSink:
    """What the shared event recorder writes through: the controller's `ClusterAPI`.

    Repeats are bumped with `patch_event` where the API offers it; without it a
    repeat is written as a new event (the recorder's answer to a 404)."""

    def __init__(self, api: ClusterAPI) -> None:
        self.api = api

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str) -> None:
        await self.api.create_event(namespace, body)

    async def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any], ctype: str,
                    namespace: str | None = None) -> None:
        patch_event = getattr(self.api, "patch_event", None)
        if patch_event is None:
            raise ApiException({"reason": "NotFound", "message": "no event patches here"}, 404)
        await patch_event(namespace or "default", name, body)


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
        """Monitor, tainter, evictor and event writer, until cancelled (caches filled first)."""
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


async def run(config: ClientConfig, cfg: NodeLifecycleConfig | None = None, *,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the node lifecycle controller against the API at `config` until cancelled.

    `started` fires once nodes, leases and pods are listed and the first
    monitor pass is done.  The client is owned (and closed) here.
    """
    async with Client(config, user_agent="fleet-node-lifecycle") as client:
        ctl = NodeLifecycleController(ApiCluster(client), cfg)
        async with trio.open_nursery() as nursery:
            # Nodes, then leases, then pods: every pod handler already sees its node.
            me = "node-lifecycle"
            await nursery.start(Informer(client, "v1", "nodes", ctl.on_node, component=me).run)
            await nursery.start(Informer(client, "coordination.k8s.io/v1", "leases", ctl.on_lease,
                                         field_selector=f"metadata.namespace={LEASE_NAMESPACE}",
                                         component=me).run)
            await nursery.start(Informer(client, "v1", "pods", ctl.on_pod, component=me).run)
            await nursery.start(ctl.run_loops)
            task_status.started()
