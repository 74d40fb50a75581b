"""The scheduler's view of the cluster: nodes with the pods bound to them, and indexes over both.

`Snapshot` holds one `NodeInfo` per node: the Node object, its allocatable
resources, the pods bound to it and the sum of their requests.  The I/O loop
keeps one Snapshot up to date from its informers (`set_node`, `set_pod`,
`set_namespace`, `set_pvc`, `set_pv`, `set_csinode`, ...) and plugins only read it: a scheduling cycle
is synchronous, so the snapshot cannot change while a cycle runs, and no copy
is needed.  Tests build one with `Snapshot.build(nodes, pods)`.

Why indexes live here.  kube-scheduler's InterPodAffinity and
PodTopologySpread walk every pod on every node in each cycle (in parallel, in
Go).  At 5,000 nodes and 10,000 pods that walk alone would cost Python tens
of milliseconds per pod.  So the snapshot keeps, *incrementally* as pods come
and go, exactly the aggregates those plugins need, and a cycle only reads them:

- `label_values(key)`: how many nodes carry each value of a label — the
  topology domains;
- `match_count(clauses)`: for a pod query (namespaces + label selector,
  possibly several ANDed), the number of matching pods per node and per
  topology value.  Queries are created on first use, then kept current on
  every pod add/remove, in a bounded LRU;
- `term_groups(kind)`: the (anti-)affinity terms carried by bound pods,
  grouped by identical term, with how many pods carry each term per topology
  value — so "does any existing pod's anti-affinity reject the incoming pod?"
  costs one check per distinct term rather than one per pod;
- per node: host ports in use and image sizes; per cluster: how many nodes
  have an image, and how many nodes carry hard / PreferNoSchedule taints.

What is read from one pod or node (requests, host ports, images, taints) is
`podinfo.py`; the parsed selectors and affinity terms are `affinity.py`.
Resource amounts are integers in the unit Kubernetes compares them in:
millicores for `cpu`, plain units (bytes, counts) for everything else.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api.pvmatch import SELECTED_NODE, volume_class
from fleet.api.selectors import DOUBLE_EQUALS, EQUALS, IN, LabelSelector
from fleet.scheduler.affinity import TERM_KINDS, AffinityTerm, PodAffinity, pod_affinity
from fleet.scheduler.podinfo import (
    Resources,
    _add,
    _taint_flags,
    is_terminated,
    node_images,
    pod_host_ports,
    pod_key,
    pod_requests,
    resource_list,
)

HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"

# How many pod queries `match_count` keeps current.  Each costs one selector
# match per pod add/remove; a query is typically one per workload.
MATCH_CACHE_SIZE = 256


# ---------------------------------------------------------------------------
# Incrementally maintained aggregates.
# ---------------------------------------------------------------------------

Clause = tuple[frozenset[str] | None, LabelSelector]  # (namespaces or None for all, selector)


def _anchors(clauses: tuple[Clause, ...]) -> list[tuple[str | None, tuple[str, str] | None]]:
    """Where a query is filed in the snapshot's match index.

    By the first clause's namespaces (None: any) and, when its selector
    requires a label to equal one of a few values, by those (key, value)
    pairs — a pod can only match if it carries one of them.  Otherwise by
    (namespace, None): checked for every pod of the namespace.
    """
    namespaces, selector = clauses[0]
    pairs: list[tuple[str, str] | None] = [None]
    for r in selector.requirements:
        if r.operator in (EQUALS, DOUBLE_EQUALS, IN) and 0 < len(r.values) <= 8:
            pairs = [(r.key, v) for v in r.values]
            break
    spaces: list[str | None] = [None] if namespaces is None else list(namespaces)
    return [(ns, kv) for ns in spaces for kv in pairs]


class MatchCount:
    """Pods matching a query, counted per node and per topology value, kept current by the Snapshot.

    The query is a conjunction of clauses, each a set of namespaces (None:
    any) and a label selector — one clause for a topology spread constraint or
    an anti-affinity term, one per term for required affinity (a pod counts
    only if it matches *all* of the incoming pod's affinity terms).  Only pods
    bound to nodes the snapshot knows are counted.  Plugins must treat the
    returned dicts as read-only.
    """

    __slots__ = ("clauses", "skip_terminating", "per_node", "_topology", "_snapshot")

    def __init__(self, snapshot: Snapshot, clauses: tuple[Clause, ...], skip_terminating: bool) -> None:
        self.clauses = clauses
        self.skip_terminating = skip_terminating
        self.per_node: dict[str, int] = {}
        self._topology: dict[str, dict[str, int]] = {}
        self._snapshot = snapshot

    def matches(self, namespace: str, labels: dict[str, str], terminating: bool) -> bool:
        if terminating and self.skip_terminating:
            return False
        for namespaces, selector in self.clauses:
            if namespaces is not None and namespace not in namespaces:
                return False
            if not selector.matches(labels):
                return False
        return True

    def topology(self, key: str) -> dict[str, int]:
        """topology value -> matching pods on nodes with that value of label `key` (zeros omitted)."""
        counts = self._topology.get(key)
        if counts is None:
            counts = {}
            nodes = self._snapshot._nodes
            for name, n in self.per_node.items():
                value = nodes[name].labels.get(key)
                if value is not None:
                    counts[value] = counts.get(value, 0) + n
            self._topology[key] = counts
        return counts

    def _bump(self, node: str, labels: Mapping[str, str], delta: int) -> None:
        n = self.per_node.get(node, 0) + delta
        if n:
            self.per_node[node] = n
        else:
            self.per_node.pop(node, None)
        for key, counts in self._topology.items():
            value = labels.get(key)
            if value is not None:
                _bump(counts, value, delta)


class TermGroup:
    """One distinct (anti-)affinity term carried by bound pods, with where those pods are.

    `counts[v]` is how many carriers of the term sit on nodes whose
    `term.topology_key` label is `v`; `weight` is the term's weight
    (preferred terms) or 0 (required terms).
    """

    __slots__ = ("term", "weight", "counts", "refs")

    def __init__(self, term: AffinityTerm, weight: int) -> None:
        self.term = term
        self.weight = weight
        self.counts: dict[str, int] = {}
        self.refs = 0


def _bump(counts: dict[str, int], key: str, delta: int) -> None:
    n = counts.get(key, 0) + delta
    if n:
        counts[key] = n
    else:
        counts.pop(key, None)


@dataclass
class NodeInfo:
    """One node and what is already committed on it."""

    node: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    requested: Resources = field(default_factory=dict)
    non_zero_requested: Resources = field(default_factory=dict)
    allocatable: Resources = field(default_factory=dict)
    # (protocol, port) -> host IP -> number of pods binding it.
    used_ports: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    # normalized image name -> size in bytes.
    images: dict[str, int] = field(default_factory=dict)
    # Bound pods with pod (anti-)affinity, parsed once.
    affinity_pods: dict[str, PodAffinity] = field(default_factory=dict)
    # The snapshot this node belongs to, so plugins can reach cluster-wide
    # aggregates from a node (None for a NodeInfo built on its own).
    snapshot: Snapshot | None = field(default=None, repr=False, compare=False)
    # Read for every node in every cycle, so plain attributes refreshed by
    # set_node rather than properties digging through the Node object.
    name: str = field(default="", init=False)
    labels: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    taints: list[Any] = field(default_factory=list, init=False, repr=False)
    unschedulable: bool = field(default=False, init=False)
    _raw_images: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.set_node(self.node)

    def clone(self) -> NodeInfo:
        """A copy to try things on (preemption: remove victims, re-run filters).

        Pods are shared, aggregates copied; the clone still points at the
        owning snapshot but the snapshot does not know the clone.
        """
        c = copy.copy(self)
        c.pods = dict(self.pods)
        c.requested = dict(self.requested)
        c.non_zero_requested = dict(self.non_zero_requested)
        c.used_ports = {k: dict(v) for k, v in self.used_ports.items()}
        c.affinity_pods = dict(self.affinity_pods)
        return c

    def __deepcopy__(self, memo: dict[int, Any]) -> NodeInfo:
        # Never deep-copy the owning snapshot through the back-reference.
        if self.snapshot is not None:
            memo[id(self.snapshot)] = self.snapshot
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        return new

    def set_node(self, node: dict[str, Any]) -> None:
        self.node = node
        md = node.get("metadata") or {}
        self.name = str(md.get("name"))
        self.labels = md.get("labels") or {}
        spec = node.get("spec") or {}
        self.taints = spec.get("taints") or []
        self.unschedulable = spec.get("unschedulable") is True
        status = node.get("status") or {}
        # A node that has not reported allocatable yet is judged by its capacity.
        self.allocatable = resource_list(status.get("allocatable") or status.get("capacity"))
        raw_images = status.get("images")
        if raw_images != self._raw_images:
            self._raw_images = raw_images
            self.images = node_images(node)

    def add_pod(self, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        if key in self.pods:
            self.remove_pod(key)
        self.pods[key] = pod
        _add(self.requested, pod_requests(pod))
        _add(self.non_zero_requested, pod_requests(pod, non_zero=True))
        for ip, proto, port in pod_host_ports(pod):
            ips = self.used_ports.setdefault((proto, port), {})
            ips[ip] = ips.get(ip, 0) + 1
        aff = pod_affinity(pod)
        if aff is not None:
            self.affinity_pods[key] = aff

    def remove_pod(self, key: str) -> None:
        pod = self.pods.pop(key, None)
        if pod is None:
            return
        _add(self.requested, pod_requests(pod), -1)
        _add(self.non_zero_requested, pod_requests(pod, non_zero=True), -1)
        for ip, proto, port in pod_host_ports(pod):
            ips = self.used_ports.get((proto, port))
            if ips is not None:
                _bump(ips, ip, -1)
                if not ips:
                    del self.used_ports[(proto, port)]
        self.affinity_pods.pop(key, None)


class Snapshot:
    """Nodes and the pods bound to them, kept current by the I/O loop.

    Pods bound to a node the snapshot has not seen yet are remembered and
    counted as soon as the node appears (informers deliver the two kinds in
    no particular order).  Namespaces (for namespaceSelector), and for
    VolumeBinding claims, storage classes, PersistentVolumes (by class),
    CSINodes, CSIDrivers and CSIStorageCapacities (by class) are kept by name,
    with the volume decisions pods being bound have assumed (`promise_pv`,
    `assume_selected_node`).

    Objects handed in are kept, not copied: a caller must not mutate a pod or
    node after passing it (informers deliver a fresh object per event; the
    I/O loop deep-copies before assuming), or removing it later would
    subtract something other than what was added.  Dry runs (nominated pods,
    preemption) may `set_pod` / `remove_pod` freely inside a cycle: every
    index is updated both ways.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._sorted: list[NodeInfo] | None = None
        self._pod_node: dict[str, str] = {}  # pod key -> node name, for every counted pod
        self._orphans: dict[str, dict[str, dict[str, Any]]] = {}  # node name -> pods
        self._namespaces: dict[str, dict[str, str]] = {}  # name -> labels
        self._pvcs: dict[str, dict[str, Any]] = {}  # "namespace/name" -> PersistentVolumeClaim
        self._storage_classes: dict[str, dict[str, Any]] = {}
        # Set once the I/O loop's PVC informer has listed (Snapshot.build sets
        # it when given claims): before that a missing claim proves nothing.
        self.pvcs_synced = False
        # PersistentVolumes by class then name (VolumeBinding matches within a class);
        # `pvs_synced` as for claims: until then VolumeBinding checks claims only.
        self._pvs: dict[str, dict[str, Any]] = {}
        self._pvs_by_class: dict[str, dict[str, dict[str, Any]]] = {}
        self.pvs_synced = False
        self._csinodes: dict[str, dict[str, Any]] = {}  # node name -> CSINode
        self._csidrivers: dict[str, dict[str, Any]] = {}  # driver name -> CSIDriver
        # CSIStorageCapacity by class then "namespace/name".
        self._capacities: dict[str, dict[str, dict[str, Any]]] = {}
        self._capacity_class: dict[str, str] = {}  # "namespace/name" -> class
        # Assumed volume decisions (kube-scheduler's assume cache): PVs promised to a
        # claim ("namespace/name") and claims given a node to provision on, by pods
        # between their scheduling cycle and the end of their pre-bind, so no other
        # pod is promised the same volume meanwhile.
        self._promised_pvs: dict[str, str] = {}
        self._assumed_nodes: dict[str, str] = {}
        self._label_values: dict[str, dict[str, int]] = {}  # label key -> value -> nodes
        self._label_nodes: dict[str, int] = {}  # label key -> nodes carrying it
        self._image_nodes: dict[str, int] = {}  # normalized image -> nodes having it
        self._hard_tainted = 0  # nodes with a NoSchedule/NoExecute taint
        self._soft_tainted = 0  # nodes with a PreferNoSchedule taint
        self._groups: dict[str, dict[tuple[AffinityTerm, int], TermGroup]] = {k: {} for k in TERM_KINDS}
        self._match_cache: OrderedDict[tuple[tuple[Clause, ...], bool], MatchCount] = OrderedDict()
        # (namespace or None, (label key, value) or None) -> queries a pod with
        # that namespace and label could match: a pod add checks only those.
        self._match_index: dict[tuple[str | None, tuple[str, str] | None], set[MatchCount]] = {}

    @classmethod
    def build(cls, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]] = (), *,
              namespaces: Iterable[dict[str, Any]] = (),
              pvcs: Iterable[dict[str, Any]] | None = None,
              storage_classes: Iterable[dict[str, Any]] = (),
              pvs: Iterable[dict[str, Any]] | None = None,
              csinodes: Iterable[dict[str, Any]] = (), csidrivers: Iterable[dict[str, Any]] = (),
              capacities: Iterable[dict[str, Any]] = ()) -> Snapshot:
        snap = cls()
        for n in nodes:
            snap.set_node(n)
        for p in pods:
            snap.set_pod(p)
        for ns in namespaces:
            snap.set_namespace(ns)
        for sc in storage_classes:
            snap.set_storage_class(sc)
        if pvcs is not None:
            for pvc in pvcs:
                snap.set_pvc(pvc)
            snap.pvcs_synced = True
        if pvs is not None:
            for pv in pvs:
                snap.set_pv(pv)
            snap.pvs_synced = True
        for obj in csinodes:
            snap.set_csinode(obj)
        for obj in csidrivers:
            snap.set_csidriver(obj)
        for obj in capacities:
            snap.set_capacity(obj)
        return snap

    # -- nodes ---------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        """Every node, in name order (so results do not depend on event order).

        The list is cached until a node is added or removed; do not mutate it.
        """
        if self._sorted is None:
            self._sorted = [self._nodes[k] for k in sorted(self._nodes)]
        return self._sorted

    def get(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    def __len__(self) -> int:
        return len(self._nodes)

    def set_node(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        info = self._nodes.get(name)
        if info is None:
            info = NodeInfo(node, snapshot=self)
            self._nodes[name] = info
            self._sorted = None
            self._count_node(info, 1)
            for pod in self._orphans.pop(name, {}).values():
                self._attach(info, pod)
            return
        old = info.node
        relabelled = (old.get("metadata") or {}).get("labels") != (node.get("metadata") or {}).get("labels")
        if not relabelled and old.get("spec") == node.get("spec") and \
                (old.get("status") or {}).get("images") == (node.get("status") or {}).get("images"):
            # The common update (a status heartbeat): no index moves.
            info.set_node(node)
            return
        self._count_node(info, -1)
        if relabelled:
            # Topology moved under the node's pods: take them out under the
            # old labels and back in under the new ones (rare: relabelling).
            pods = list(info.pods.values())
            for pod in pods:
                self._detach(info, pod_key(pod))
            info.set_node(node)
            for pod in pods:
                self._attach(info, pod)
        else:
            info.set_node(node)
        self._count_node(info, 1)

    def remove_node(self, name: str) -> None:
        info = self._nodes.get(name)
        if info is None:
            return
        pods = dict(info.pods)
        for key in pods:
            self._detach(info, key)
        self._count_node(info, -1)
        del self._nodes[name]
        self._sorted = None
        if pods:
            # Its pods still exist (the node lifecycle controller deletes them);
            # keep them so a node re-registering under the same name counts them.
            self._orphans[name] = pods

    def _count_node(self, info: NodeInfo, sign: int) -> None:
        for key, value in info.labels.items():
            _bump(self._label_values.setdefault(key, {}), value, sign)
            if not self._label_values[key]:
                del self._label_values[key]
            _bump(self._label_nodes, key, sign)
        for image in info.images:
            _bump(self._image_nodes, image, sign)
        hard, soft = _taint_flags(info.node)
        self._hard_tainted += sign * hard
        self._soft_tainted += sign * soft

    # -- pods ----------------------------------------------------------------
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
            self._attach(info, pod)
        else:
            self._orphans.setdefault(node, {})[key] = pod

    def remove_pod(self, key: str) -> None:
        node = self._pod_node.pop(key, None)
        if node is None:
            return
        info = self._nodes.get(node)
        if info is not None:
            self._detach(info, key)
        orphans = self._orphans.get(node)
        if orphans is not None:
            orphans.pop(key, None)
            if not orphans:
                del self._orphans[node]

    def _attach(self, info: NodeInfo, pod: dict[str, Any]) -> None:
        info.add_pod(pod)
        self._index(info, pod, pod_key(pod), 1)

    def _detach(self, info: NodeInfo, key: str) -> None:
        pod = info.pods.get(key)
        if pod is None:
            return
        self._index(info, pod, key, -1)
        info.remove_pod(key)

    def _index(self, info: NodeInfo, pod: dict[str, Any], key: str, sign: int) -> None:
        """Add (sign 1) or remove (-1) the pod's share of the match counts and term groups."""
        labels = info.labels
        if self._match_cache:
            md = pod.get("metadata") or {}
            ns = str(md.get("namespace") or "")
            plabels = md.get("labels") or {}
            terminating = bool(md.get("deletionTimestamp"))
            for mc in self._match_candidates(ns, plabels):
                if mc.matches(ns, plabels, terminating):
                    mc._bump(info.name, labels, sign)
        aff = info.affinity_pods.get(key)
        if aff is None:
            return
        for kind, term, weight in aff.by_kind():
            groups = self._groups[kind]
            group = groups.get((term, weight))
            if group is None:
                if sign < 0:
                    continue
                group = groups[(term, weight)] = TermGroup(term, weight)
            group.refs += sign
            value = labels.get(term.topology_key)
            if value is not None:
                _bump(group.counts, value, sign)
            if group.refs <= 0:
                del groups[(term, weight)]

    # -- aggregates read by plugins --------------------------------------------
    def label_values(self, key: str) -> dict[str, int]:
        """value -> number of nodes labelled `key=value`: the topology domains of `key`."""
        return self._label_values.get(key, {})

    def nodes_with_label(self, key: str) -> int:
        return self._label_nodes.get(key, 0)

    def image_nodes(self, image: str) -> int:
        """How many nodes hold the (normalized) image."""
        return self._image_nodes.get(image, 0)

    @property
    def has_hard_taints(self) -> bool:
        """Whether any node carries a NoSchedule or NoExecute taint."""
        return self._hard_tainted > 0

    @property
    def has_prefer_no_schedule_taints(self) -> bool:
        return self._soft_tainted > 0

    def term_groups(self, kind: str) -> Iterable[TermGroup]:
        """The distinct terms of kind `kind` carried by bound pods (see TERM_KINDS)."""
        return self._groups[kind].values()

    def match_count(self, clauses: tuple[Clause, ...], *, skip_terminating: bool = False) -> MatchCount:
        """The (cached, incrementally maintained) count of bound pods matching all `clauses`.

        The first call for a query walks every bound pod once; later calls are
        a dict lookup, because every pod add/remove updates the cached counts.
        """
        key = (clauses, skip_terminating)
        mc = self._match_cache.get(key)
        if mc is not None:
            self._match_cache.move_to_end(key)
            return mc
        mc = MatchCount(self, clauses, skip_terminating)
        for info in self._nodes.values():
            for pod in info.pods.values():
                md = pod.get("metadata") or {}
                if mc.matches(str(md.get("namespace") or ""), md.get("labels") or {},
                              bool(md.get("deletionTimestamp"))):
                    mc.per_node[info.name] = mc.per_node.get(info.name, 0) + 1
        self._match_cache[key] = mc
        for anchor in _anchors(clauses):
            self._match_index.setdefault(anchor, set()).add(mc)
        if len(self._match_cache) > MATCH_CACHE_SIZE:
            (old_clauses, _), old = self._match_cache.popitem(last=False)
            for anchor in _anchors(old_clauses):
                bucket = self._match_index.get(anchor)
                if bucket is not None:
                    bucket.discard(old)
                    if not bucket:
                        del self._match_index[anchor]
        return mc

    def _match_candidates(self, namespace: str, labels: Mapping[str, str]) -> set[MatchCount]:
        """The cached queries a pod in `namespace` with `labels` could match (a superset)."""
        index = self._match_index
        out: set[MatchCount] = set()
        for ns in (namespace, None):
            bucket = index.get((ns, None))
            if bucket:
                out |= bucket
            for kv in labels.items():
                bucket = index.get((ns, kv))
                if bucket:
                    out |= bucket
        return out

    # -- namespaces, claims, storage classes -----------------------------------
    def set_namespace(self, namespace: dict[str, Any]) -> None:
        md = namespace.get("metadata") or {}
        self._namespaces[str(md.get("name") or "")] = dict(md.get("labels") or {})

    def remove_namespace(self, name: str) -> None:
        self._namespaces.pop(name, None)

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """The namespace's labels, or None if the snapshot has not seen it."""
        return self._namespaces.get(name)

    def namespaces_matching(self, selector: LabelSelector) -> frozenset[str]:
        """Names of the known namespaces whose labels `selector` selects."""
        return frozenset(n for n, labels in self._namespaces.items() if selector.matches(labels))

    def set_pvc(self, pvc: dict[str, Any]) -> None:
        self._pvcs[pod_key(pvc)] = pvc

    def remove_pvc(self, key: str) -> None:
        """Forget the claim `namespace/name`."""
        self._pvcs.pop(key, None)

    def pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._pvcs.get(f"{namespace}/{name}")

    def set_storage_class(self, sc: dict[str, Any]) -> None:
        self._storage_classes[str((sc.get("metadata") or {}).get("name") or "")] = sc

    def remove_storage_class(self, name: str) -> None:
        self._storage_classes.pop(name, None)

    def storage_class(self, name: str) -> dict[str, Any] | None:
        return self._storage_classes.get(name)

    def storage_classes(self) -> dict[str, dict[str, Any]]:
        """name -> StorageClass (read-only)."""
        return self._storage_classes

    # -- persistent volumes, CSI objects ---------------------------------------
    def set_pv(self, pv: dict[str, Any]) -> None:
        name = str((pv.get("metadata") or {}).get("name") or "")
        self.remove_pv(name)
        self._pvs[name] = pv
        self._pvs_by_class.setdefault(volume_class(pv), {})[name] = pv

    def remove_pv(self, name: str) -> None:
        old = self._pvs.pop(name, None)
        if old is None:
            return
        cls = volume_class(old)
        bucket = self._pvs_by_class.get(cls)
        if bucket is not None:
            bucket.pop(name, None)
            if not bucket:
                del self._pvs_by_class[cls]

    def pv(self, name: str) -> dict[str, Any] | None:
        return self._pvs.get(name)

    def pvs_of_class(self, class_name: str) -> Iterable[dict[str, Any]]:
        """The PersistentVolumes of one class ("" for volumes without a class)."""
        return self._pvs_by_class.get(class_name, {}).values()

    def set_csinode(self, csinode: dict[str, Any]) -> None:
        self._csinodes[str((csinode.get("metadata") or {}).get("name") or "")] = csinode

    def remove_csinode(self, name: str) -> None:
        self._csinodes.pop(name, None)

    def csinode(self, node: str) -> dict[str, Any] | None:
        return self._csinodes.get(node)

    def set_csidriver(self, driver: dict[str, Any]) -> None:
        self._csidrivers[str((driver.get("metadata") or {}).get("name") or "")] = driver

    def remove_csidriver(self, name: str) -> None:
        self._csidrivers.pop(name, None)

    def csidriver(self, name: str) -> dict[str, Any] | None:
        return self._csidrivers.get(name)

    def set_capacity(self, capacity: dict[str, Any]) -> None:
        key = pod_key(capacity)
        self.remove_capacity(key)
        cls = str(capacity.get("storageClassName") or "")
        self._capacities.setdefault(cls, {})[key] = capacity
        self._capacity_class[key] = cls

    def remove_capacity(self, key: str) -> None:
        """Forget the CSIStorageCapacity `namespace/name`."""
        cls = self._capacity_class.pop(key, None)
        if cls is None:
            return
        bucket = self._capacities.get(cls)
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self._capacities[cls]

    def capacities_of_class(self, class_name: str) -> Iterable[dict[str, Any]]:
        return self._capacities.get(class_name, {}).values()

    # -- assumed volume decisions ------------------------------------------------
    def promise_pv(self, pv_name: str, claim_key: str) -> None:
        """Keep `pv_name` for the claim `namespace/name` until `release_pv`."""
        self._promised_pvs[pv_name] = claim_key

    def release_pv(self, pv_name: str, claim_key: str) -> None:
        if self._promised_pvs.get(pv_name) == claim_key:
            del self._promised_pvs[pv_name]

    def promised_pvs(self, except_claim: str = "") -> set[str]:
        """PVs promised to claims other than `except_claim`."""
        return {pv for pv, claim in self._promised_pvs.items() if claim != except_claim}

    def assume_selected_node(self, claim_key: str, node: str) -> None:
        """The claim is to be provisioned on `node` (its selected-node is being written)."""
        self._assumed_nodes[claim_key] = node

    def forget_selected_node(self, claim_key: str, node: str) -> None:
        if self._assumed_nodes.get(claim_key) == node:
            del self._assumed_nodes[claim_key]

    def selected_node(self, claim: dict[str, Any]) -> str | None:
        """Where the claim is to be provisioned: assumed by a pod being bound, else
        its `volume.kubernetes.io/selected-node` annotation."""
        assumed = self._assumed_nodes.get(pod_key(claim))
        if assumed is not None:
            return assumed
        value = ((claim.get("metadata") or {}).get("annotations") or {}).get(SELECTED_NODE)
        return str(value) if value is not None else None
