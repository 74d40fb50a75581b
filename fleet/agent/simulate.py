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

Resource usage: simulated nodes serve no metrics themselves (nothing runs, and
their addresses answer nothing).  A pod may declare the usage it pretends to
have with the `fleet.dev/simulate-cpu` / `fleet.dev/simulate-memory`
annotations; the API server's resource metrics API reads them for pods on
nodes labelled `fleet.dev/simulated=true` (fleet/api/kinds/metrics.py), so
`kubectl top` and the HPA work on simulated nodes too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import ipaddress
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import trio

from fleet.agent.node import (
    KUBELET_VERSION,
    LEASE_NAMESPACE,
    MachineStats,
    node_conditions,
    now_micro,
)
from fleet.agent.status import ContainerView, build_pod_status
from fleet.api.meta import now_rfc3339
from fleet.client import MERGE_PATCH, ApiException, Client, ClientConfig, resource_path
from fleet.client.errors import explain
from fleet.client.informer import Informer
from fleet.client.rest import ssl_context

log = logging.getLogger(__name__)

SIMULATED_LABEL = "fleet.dev/simulated"
EXIT_AFTER_ANNOTATION = "fleet.dev/simulate-exit-after"
EXIT_CODE_ANNOTATION = "fleet.dev/simulate-exit-code"
NODE_ADDRESS_RANGE = "198.18.0.0/15"
FALLBACK_POD_RANGE = "100.64.0.0/10"
KUBELET_PORT = 10250
MAX_NODES = 1 << (24 - 10)  # one fallback /24 per node in the /10
BOUND_PODS = "spec.nodeName!="
RUNTIME_VERSION = "sim://fleet"
# Conditions of a node with no pressure of any kind: the kubelet's own wording.
_HEALTHY = MachineStats(mem_total=0, mem_available=0, disk_total=0, disk_free=0, pids=0, pid_max=0)
RETRYABLE = (ApiException, httpx.TransportError, OSError)
# How late a Lease renewal may start before pod work makes way for heartbeats.
LEASE_LAG_LIMIT = 1.0

PENDING, RUNNING, TERMINAL, GONE = "pending", "running", "terminal", "gone"


@dataclass(frozen=True)
class NodeShape:
    """One machine size: what a cloud instance type would give the node."""

    cpu: int
    memory_gi: int
    storage_gi: int
    instance_type: str


# A general-purpose family (4 GiB per core, like m5/n2-standard), small to large.
DEFAULT_SHAPES = (
    NodeShape(4, 16, 100, "sim.xlarge"),
    NodeShape(8, 32, 200, "sim.2xlarge"),
    NodeShape(16, 64, 400, "sim.4xlarge"),
    NodeShape(32, 128, 800, "sim.8xlarge"),
)


@dataclass
class SimulatorConfig:
    """Everything `fleet agent --simulate` is told; tests build it directly."""

    count: int = 10
    prefix: str = "sim"
    zones: int = 3
    region: str = "region-1"
    lease_interval: float = 10.0
    lease_duration: int = 40
    node_status_interval: float = 60.0
    start_delay: float = 0.5
    # Requests in flight: pod status writes and deletes / lease renewals and node
    # status (None: one per 100 nodes, 8 to 64 — see `lease_workers`).
    pod_concurrency: int = 16
    lease_concurrency: int | None = None
    shapes: tuple[NodeShape, ...] = DEFAULT_SHAPES
    labels: dict[str, str] = field(default_factory=dict)
    # Loopback control endpoint: None off, 0 any free port.
    control_port: int | None = None
    retry_backoff: float = 1.0
    # Heartbeats fire on ticks this far apart (0: each at its exact time); see
    # the module docstring for why a little coalescing helps the server.
    heartbeat_tick: float = 0.25

    def validate(self) -> None:
        if not 1 <= self.count <= MAX_NODES:
            raise ValueError(f"--simulate takes 1 to {MAX_NODES} nodes, not {self.count}")
        if self.zones < 1:
            raise ValueError("--simulate-zones must be at least 1")
        if self.lease_interval <= 0 or self.node_status_interval <= 0:
            raise ValueError("lease and node status intervals must be positive")
        if self.start_delay < 0:
            raise ValueError("--simulate-start-delay cannot be negative")
        if self.pod_concurrency < 1 or (self.lease_concurrency is not None
                                        and self.lease_concurrency < 1):
            raise ValueError("concurrency must be at least 1")
        if not self.shapes:
            raise ValueError("at least one node shape is needed")

    @property
    def lease_workers(self) -> int:
        """Heartbeat requests in flight.

        The renewal rate is at most (requests in flight) / (server latency), and a
        loaded server answers in tens of milliseconds: with 8 in flight, 5,000
        nodes got ~290 renewals/s of the 500/s they need and their Leases aged
        towards the 40 s grace period; with 50 (one per 100 nodes) they got the
        full rate from the same server on a quiet machine (bench/sim_nodes.py).
        """
        if self.lease_concurrency is not None:
            return self.lease_concurrency
        return min(64, max(8, math.ceil(self.count / 100)))


@dataclass
class SimulatorStats:
    """Counters for tests, the control endpoint and benchmarks."""

    nodes_registered: int = 0
    registration_seconds: float | None = None
    lease_renewals: int = 0
    lease_failures: int = 0
    node_status_updates: int = 0
    pods_started: int = 0
    pods_finished: int = 0
    pods_deleted: int = 0
    pod_request_failures: int = 0
    # Times a pod worker held back because Lease renewals were running late.
    pod_work_deferred: int = 0


# --------------------------------------------------------------------------- pure parts


def node_names(prefix: str, count: int) -> list[str]:
    """`sim-0000` .. `sim-0999`: zero-padded so names sort in index order."""
    width = max(4, len(str(count - 1)))
    return [f"{prefix}-{i:0{width}d}" for i in range(count)]


def zone_names(count: int) -> list[str]:
    """zone-a, zone-b, ... (zone-27 and so on past the alphabet)."""
    return [f"zone-{chr(ord('a') + i)}" if i < 26 else f"zone-{i + 1}" for i in range(count)]


def nth_address(cidr: str, n: int) -> str:
    net = ipaddress.IPv4Network(cidr)
    return str(ipaddress.IPv4Address(int(net.network_address) + n))


def fallback_pod_cidr(index: int) -> str:
    """Node `index`'s private /24 in 100.64.0.0/10, used when it has no podCIDR."""
    return f"{nth_address(FALLBACK_POD_RANGE, index * 256)}/24"


def first_due(index: int, count: int, interval: float, origin: float, after: float) -> float:
    """The first time after `after` at node `index`'s phase (index/count of `interval`).

    Fixed phases spread N periodic writes evenly over the interval whatever the
    order and speed of registration, and keep them spread afterwards.  Strictly
    after: a Lease or status written just now is not written again at once.
    """
    phase = origin + interval * index / count
    if after < phase:
        return phase
    return phase + (math.floor((after - phase) / interval) + 1) * interval


def next_due(previous: float, interval: float, now: float) -> float:
    """The next slot after `previous` at the same phase, skipping slots already past."""
    due = previous + interval
    if due <= now:
        due += math.ceil((now - due) / interval) * interval
        if due <= now:
            due += interval
    return due


def ready_conditions(now: str, since: str) -> list[dict[str, Any]]:
    """The four node conditions of a healthy node; each True/False since `since`."""
    conds = node_conditions(_HEALTHY, None, now)
    for c in conds:
        c["lastTransitionTime"] = since
    return conds


@dataclass(slots=True)
class SimNode:
    """One simulated node: identity, shape, heartbeat schedule and pod addresses."""

    name: str
    index: int
    zone: str
    shape: NodeShape
    address: str
    uid: str = ""
    pod_cidr: str = ""
    cidr_checked: bool = False
    registered: bool = False
    paused: bool = False
    frozen: bool = False
    hb_token: int = 0
    lease_due: float = 0.0
    status_due: float = 0.0
    status_dirty: bool = False
    last_renewal: float | None = None
    ready_since: str = ""
    blocks: dict[str, AddressBlock] = field(default_factory=dict)

    def allocate_ip(self) -> str:
        """A free pod address: from the podCIDR when there is one, else the private /24."""
        cidr = self.pod_cidr or fallback_pod_cidr(self.index)
        block = self.blocks.get(cidr)
        if block is None:
            block = self.blocks[cidr] = AddressBlock(cidr)
        ip = block.allocate()
        if ip is None and cidr != fallback_pod_cidr(self.index):
            # A full podCIDR (more pods than a /24 holds): borrow from the private range.
            return self._fallback().allocate() or "0.0.0.0"
        return ip or "0.0.0.0"

    def _fallback(self) -> AddressBlock:
        cidr = fallback_pod_cidr(self.index)
        block = self.blocks.get(cidr)
        if block is None:
            block = self.blocks[cidr] = AddressBlock(cidr)
        return block

    def claim_ip(self, ip: str) -> None:
        """Mark an address a pod already has as used (pods adopted after a restart)."""
        for cidr in {self.pod_cidr, fallback_pod_cidr(self.index)} - {""}:
            block = self.blocks.get(cidr)
            if block is None:
                block = self.blocks[cidr] = AddressBlock(cidr)
            if block.claim(ip):
                return

    def release_ip(self, ip: str | None) -> None:
        if not ip:
            return
        for block in self.blocks.values():
            if block.release(ip):
                return


class AddressBlock:
    """Host addresses .2 up to the last-but-one of a subnet (.1 is the node's gateway)."""

    def __init__(self, cidr: str) -> None:
        net = ipaddress.IPv4Network(cidr, strict=False)
        self.cidr = str(net)
        self.base = int(net.network_address)
        self.size = net.num_addresses
        self._used: set[int] = set()
        self._next = 2

    def allocate(self) -> str | None:
        for off in itertools.chain(range(self._next, self.size - 1), range(2, self._next)):
            if off not in self._used:
                self._used.add(off)
                self._next = off + 1
                return str(ipaddress.IPv4Address(self.base + off))
        return None

    def _offset(self, ip: str) -> int | None:
        try:
            off = int(ipaddress.IPv4Address(ip)) - self.base
        except ValueError:
            return None
        return off if 0 <= off < self.size else None

    def claim(self, ip: str) -> bool:
        off = self._offset(ip)
        if off is None:
            return False
        self._used.add(off)
        return True

    def release(self, ip: str) -> bool:
        off = self._offset(ip)
        if off is None or off not in self._used:
            return False
        self._used.discard(off)
        return True

    def __len__(self) -> int:
        return len(self._used)


def make_nodes(cfg: SimulatorConfig) -> list[SimNode]:
    """The nodes of a simulator: zones round-robin, shapes cycling within each zone."""
    zones = zone_names(cfg.zones)
    out = []
    for i, name in enumerate(node_names(cfg.prefix, cfg.count)):
        shape = cfg.shapes[(i // cfg.zones) % len(cfg.shapes)]
        out.append(SimNode(name=name, index=i, zone=zones[i % cfg.zones], shape=shape,
                           address=nth_address(NODE_ADDRESS_RANGE, i + 1)))
    return out


def node_labels(cfg: SimulatorConfig, node: SimNode) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": node.zone,
        "topology.kubernetes.io/region": cfg.region,
        "node.kubernetes.io/instance-type": node.shape.instance_type,
        SIMULATED_LABEL: "true",
        **cfg.labels,
    }


def node_status(node: SimNode, *, boot_id: str, now: str) -> dict[str, Any]:
    """The whole Node status, as a kubelet with default eviction thresholds reports it."""
    s = node.shape
    capacity = {"cpu": str(s.cpu), "memory": f"{s.memory_gi}Gi",
                "ephemeral-storage": f"{s.storage_gi}Gi", "pods": "110"}
    allocatable = {"cpu": str(s.cpu),
                   # memory.available<100Mi and nodefs.available<10% are held back.
                   "memory": f"{s.memory_gi * 1024 - 100}Mi",
                   "ephemeral-storage": f"{s.storage_gi * 1024 * 9 // 10}Mi", "pods": "110"}
    ident = hashlib.sha256(node.name.encode()).hexdigest()
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": ready_conditions(now, node.ready_since or now),
        "addresses": [{"type": "InternalIP", "address": node.address},
                      {"type": "Hostname", "address": node.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
        "nodeInfo": {
            "machineID": ident[:32],
            "systemUUID": str(uuid.UUID(ident[32:64])),
            "bootID": boot_id,
            "kernelVersion": "6.1.0-fleet-sim",
            "osImage": "Fleet simulated node",
            "containerRuntimeVersion": RUNTIME_VERSION,
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def node_object(cfg: SimulatorConfig, node: SimNode, *, boot_id: str, now: str) -> dict[str, Any]:
    """The Node as first created (a Node may be created with its status, unlike most kinds)."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node.name, "labels": node_labels(cfg, node),
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"providerID": f"fleet-sim://{node.name}"},
        "status": node_status(node, boot_id=boot_id, now=now),
    }


def lease_object(cfg: SimulatorConfig, node: SimNode, now: str) -> dict[str, Any]:
    owner = ([{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}]
             if node.uid else [])
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node.name, "namespace": LEASE_NAMESPACE,
                         "ownerReferences": owner},
            "spec": {"holderIdentity": node.name, "leaseDurationSeconds": cfg.lease_duration,
                     "acquireTime": now, "renewTime": now}}


@lru_cache(maxsize=1024)
def _image_id(image: str) -> str:
    """A digest reference as a runtime reports it: the repository (no tag) @ a fake digest."""
    repo = image.rsplit("@", 1)[0]
    slash = repo.rfind("/")
    colon = repo.rfind(":")
    if colon > slash:
        repo = repo[:colon]
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _pod_status(pod: Mapping[str, Any], *, pod_ip: str, host_ip: str, started: str,
                exit_code: int | None, now: str) -> dict[str, Any]:
    """Pod status with every container running (exit_code None) or exited with exit_code."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")[:8]
    spec = pod.get("spec") or {}

    def view(c: Mapping[str, Any], state: dict[str, Any], ready: bool) -> ContainerView:
        name = str(c.get("name") or "")
        image = str(c.get("image") or "")
        return ContainerView(name=name, image=image, state=state, ready=ready, started=ready,
                             image_id=_image_id(image), container_id=f"sim://{uid}-{name}")

    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                           "finishedAt": started if exit_code is None else now}}
    init, counted = [], []
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always" and exit_code is None:
            # A sidecar keeps running beside the app containers; having started,
            # it counts as initialized (the kubelet's rule), so the phase and
            # conditions are computed without it.
            init.append(view(c, {"running": {"startedAt": started}}, True))
        else:
            v = view(c, done, True)
            v.started = False
            init.append(v)
            counted.append(v)
    if exit_code is None:
        apps = [view(c, {"running": {"startedAt": started}}, True)
                for c in spec.get("containers") or []]
    else:
        state = {"terminated": {"exitCode": exit_code,
                                "reason": "Completed" if exit_code == 0 else "Error",
                                "startedAt": started, "finishedAt": now}}
        apps = [view(c, state, False) for c in spec.get("containers") or []]
    status = build_pod_status(pod, counted, apps, pod_ips=[pod_ip], host_ip=host_ip,
                              start_time=started, now=now)
    if init:
        status["initContainerStatuses"] = [v.to_status() for v in init]
    return status


def running_status(pod: Mapping[str, Any], *, pod_ip: str, host_ip: str,
                   now: str) -> dict[str, Any]:
    """The status of `pod` once its (imaginary) containers run and are ready."""
    return _pod_status(pod, pod_ip=pod_ip, host_ip=host_ip, started=now, exit_code=None, now=now)


def exited_status(pod: Mapping[str, Any], *, pod_ip: str, host_ip: str, started: str,
                  exit_code: int, now: str) -> dict[str, Any]:
    """The status once every container exited with `exit_code` (Succeeded or Failed)."""
    return _pod_status(pod, pod_ip=pod_ip, host_ip=host_ip, started=started,
                       exit_code=exit_code, now=now)


_CONTAINER_KEYS = ("name", "image", "resources", "restartPolicy")


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Only what the pod's simulated status is computed from.

    A pod waiting for its start (or for its planned exit) is held in memory;
    10,000 full pod objects cost tens of megabytes, this a fraction of it.
    """
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    def containers(key: str) -> list[dict[str, Any]]:
        return [{k: c[k] for k in _CONTAINER_KEYS if k in c} for c in spec.get(key) or []]

    out_spec: dict[str, Any] = {k: spec[k] for k in ("nodeName", "restartPolicy", "hostNetwork")
                                if k in spec}
    out_spec["containers"] = containers("containers")
    if spec.get("initContainers"):
        out_spec["initContainers"] = containers("initContainers")
    ann = {k: v for k, v in (md.get("annotations") or {}).items()
           if k in (EXIT_AFTER_ANNOTATION, EXIT_CODE_ANNOTATION)}
    return {"metadata": {"uid": md.get("uid"), "annotations": ann}, "spec": out_spec,
            "status": {"conditions": (pod.get("status") or {}).get("conditions") or []}}


def exit_plan(pod: Mapping[str, Any]) -> tuple[float, int] | None:
    """(seconds to run, exit code) when the pod asks to finish, else None (run forever).

    Only where the outcome is final: restartPolicy Never, or OnFailure with exit
    code 0 — a container that would be restarted is not simulated.
    """
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    after = ann.get(EXIT_AFTER_ANNOTATION)
    if after is None:
        return None
    try:
        seconds = max(0.0, float(after))
        code = int(ann.get(EXIT_CODE_ANNOTATION, "0"))
    except (TypeError, ValueError):
        return None
    policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
    if policy == "Never" or (policy == "OnFailure" and code == 0):
        return seconds, code
    return None


# --------------------------------------------------------------------------- timers


class TimerQueue:
    """Keys due at given times, fired by one task sleeping until the earliest.

    A heap instead of one sleeping task per node or pod: 15,000 tasks each with a
    deadline would cost trio's scheduler more than one heap costs us.  With a
    `granularity` the task only wakes on multiples of it, firing everything due
    by then together.
    """

    def __init__(self, granularity: float = 0.0) -> None:
        self.granularity = granularity
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self._wakeup = trio.Event()

    def push(self, due: float, key: Any) -> None:
        seq = next(self._seq)
        heapq.heappush(self._heap, (due, seq, key))
        if self._heap[0][1] == seq:
            self._wakeup.set()  # a new earliest deadline

    def __len__(self) -> int:
        return len(self._heap)

    async def run(self, fire: Callable[[Any], None]) -> None:
        """Call `fire(key)` (synchronous, non-blocking) for every key as it falls due."""
        while True:
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                fire(heapq.heappop(self._heap)[2])
            self._wakeup = trio.Event()
            deadline = self._heap[0][0] if self._heap else math.inf
            if self.granularity > 0 and deadline < math.inf:
                deadline = math.ceil(deadline / self.granularity) * self.granularity
            with trio.move_on_at(deadline):
                await self._wakeup.wait()


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
