"""The model of simulated nodes, without I/O: the simulator's configuration and
node shapes, node names, zones and addresses (InternalIPs, pod CIDR blocks),
the Node, Lease and pod status objects a simulated kubelet writes, the slim
copy of a waiting pod, a pod's planned exit, and `TimerQueue`, the heap that
fires node heartbeats and pod start/exit times from one task.  `simulate.py`
is the `Simulator` that drives them against the API server.
"""

from __future__ import annotations

import hashlib
import heapq
import ipaddress
import itertools
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import httpx
import trio

from fleet.agent.node import KUBELET_VERSION, LEASE_NAMESPACE, MachineStats, node_conditions
from fleet.agent.status import ContainerView, build_pod_status
from fleet.client import ApiException

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
