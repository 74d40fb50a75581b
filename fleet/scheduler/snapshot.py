"""The scheduler's view of the cluster: nodes with the pods bound to them.

`Snapshot` holds one `NodeInfo` per node: the Node object, its allocatable
resources, the pods bound to it and the sum of their requests.  The I/O loop
keeps one Snapshot up to date from its informers (`set_node`, `add_pod`, ...)
and plugins only read it: a scheduling cycle is synchronous, so the snapshot
cannot change while a cycle runs, and no copy is needed.  Tests build one
with `Snapshot.build(nodes, pods)`.

Resource amounts are integers in the unit Kubernetes compares them in:
millicores for `cpu`, plain units (bytes, counts) for everything else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.api.quantity import QuantityError, int_value, milli_value

Resources = dict[str, int]

# What a container without requests counts as when *scoring* (kube-scheduler's
# non-zero defaults), so a node full of BestEffort pods does not look empty.
# Filtering still uses the real requests.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

TERMINAL_PHASES = ("Succeeded", "Failed")


def quantity(resource: str, value: Any) -> int:
    """A quantity in the resource's comparison unit (millicores for cpu); 0 if malformed."""
    try:
        return milli_value(value) if resource == "cpu" else int_value(value)
    except (QuantityError, TypeError, ValueError):
        return 0


def resource_list(raw: Any) -> Resources:
    if not isinstance(raw, dict):
        return {}
    return {str(k): quantity(str(k), v) for k, v in raw.items()}


def _add(into: Resources, other: Resources, sign: int = 1) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + sign * v


def _max(into: Resources, other: Resources) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def _container_requests(c: Any, *, non_zero: bool) -> Resources:
    res = c.get("resources") if isinstance(c, dict) else None
    req = resource_list(res.get("requests") if isinstance(res, dict) else None)
    if non_zero:
        req.setdefault("cpu", 0)
        req.setdefault("memory", 0)
        if req["cpu"] == 0:
            req["cpu"] = DEFAULT_MILLI_CPU_REQUEST
        if req["memory"] == 0:
            req["memory"] = DEFAULT_MEMORY_REQUEST
    return req


def pod_requests(pod: dict[str, Any], *, non_zero: bool = False) -> Resources:
    """The resources the pod asks of a node, as kube-scheduler computes them.

    App containers run together, so their requests add up; init containers run
    one at a time before them, so the pod needs the larger of the two phases.
    Sidecars (init containers with restartPolicy Always) keep running, so they
    add to every later init container and to the app phase.  Pod overhead
    (RuntimeClass) is added on top.
    """
    spec = pod.get("spec") or {}
    app: Resources = {}
    for c in spec.get("containers") or []:
        _add(app, _container_requests(c, non_zero=non_zero))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in spec.get("initContainers") or []:
        req = _container_requests(c, non_zero=non_zero)
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            _add(sidecars, req)
            _max(init_peak, sidecars)
        else:
            step = dict(sidecars)
            _add(step, req)
            _max(init_peak, step)
    total = dict(app)
    _add(total, sidecars)
    _max(total, init_peak)
    _add(total, resource_list(spec.get("overhead")))
    return {k: v for k, v in total.items() if v}


def pod_key(pod: dict[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def is_terminated(pod: dict[str, Any]) -> bool:
    """Succeeded and Failed pods hold no resources on their node any more."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


@dataclass
class NodeInfo:
    """One node and what is already committed on it."""

    node: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    requested: Resources = field(default_factory=dict)
    non_zero_requested: Resources = field(default_factory=dict)
    allocatable: Resources = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.set_node(self.node)

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    @property
    def labels(self) -> dict[str, str]:
        return (self.node.get("metadata") or {}).get("labels") or {}

    def set_node(self, node: dict[str, Any]) -> None:
        self.node = node
        status = node.get("status") or {}
        # A node that has not reported allocatable yet is judged by its capacity.
        self.allocatable = resource_list(status.get("allocatable") or status.get("capacity"))

    def add_pod(self, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        if key in self.pods:
            self.remove_pod(key)
        self.pods[key] = pod
        _add(self.requested, pod_requests(pod))
        _add(self.non_zero_requested, pod_requests(pod, non_zero=True))

    def remove_pod(self, key: str) -> None:
        pod = self.pods.pop(key, None)
        if pod is not None:
            _add(self.requested, pod_requests(pod), -1)
            _add(self.non_zero_requested, pod_requests(pod, non_zero=True), -1)


class Snapshot:
    """Nodes and the pods bound to them, kept current by the I/O loop.

    Pods bound to a node the snapshot has not seen yet are remembered and
    counted as soon as the node appears (informers deliver the two kinds in
    no particular order).
    """

    def __init__(self) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._pod_node: dict[str, str] = {}  # pod key -> node name, for every counted pod
        self._orphans: dict[str, dict[str, dict[str, Any]]] = {}  # node name -> pods

    @classmethod
    def build(cls, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]] = ()) -> Snapshot:
        snap = cls()
        for n in nodes:
            snap.set_node(n)
        for p in pods:
            snap.set_pod(p)
        return snap

    def nodes(self) -> list[NodeInfo]:
        """Every node, in name order (so results do not depend on event order)."""
        return [self._nodes[k] for k in sorted(self._nodes)]

    def get(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    def __len__(self) -> int:
        return len(self._nodes)

    def set_node(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        info = self._nodes.get(name)
        if info is not None:
            info.set_node(node)
            return
        info = NodeInfo(node)
        for pod in self._orphans.pop(name, {}).values():
            info.add_pod(pod)
        self._nodes[name] = info

    def remove_node(self, name: str) -> None:
        info = self._nodes.pop(name, None)
        if info is not None and info.pods:
            # Its pods still exist (the node lifecycle controller deletes them);
            # keep them so a node re-registering under the same name counts them.
            self._orphans[name] = dict(info.pods)

    def set_pod(self, pod: dict[str, Any]) -> None:
        """Count a pod on its node, or stop counting it (unbound, terminated)."""
        key = pod_key(pod)
        self.remove_pod(key)
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or is_terminated(pod):
            return
        self._pod_node[key] = node
        info = self._nodes.get(node)
        if info is not None:
            info.add_pod(pod)
        else:
            self._orphans.setdefault(node, {})[key] = pod

    def remove_pod(self, key: str) -> None:
        node = self._pod_node.pop(key, None)
        if node is None:
            return
        info = self._nodes.get(node)
        if info is not None:
            info.remove_pod(key)
        orphans = self._orphans.get(node)
        if orphans is not None:
            orphans.pop(key, None)
            if not orphans:
                del self._orphans[node]
