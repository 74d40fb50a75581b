"""Hand-built Nodes, Pods and scheduling terms for the scheduler's table-driven tests."""

from __future__ import annotations

from typing import Any

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"


def node(name: str, cpu: str = "4", memory: str = "8Gi", pods: int | None = 110, *,
         labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         unschedulable: bool = False, zone: str | None = None,
         images: list[tuple[list[str], int]] | None = None, **extra: str) -> dict[str, Any]:
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory, **extra}
    if pods is not None:
        allocatable["pods"] = str(pods)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    all_labels = {HOSTNAME: name, **({ZONE: zone} if zone else {}), **(labels or {})}
    status: dict[str, Any] = {"allocatable": allocatable, "capacity": dict(allocatable)}
    if images is not None:
        status["images"] = [{"names": names, "sizeBytes": size} for names, size in images]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels},
            "spec": spec, "status": status}


def container(name: str = "c", cpu: str | None = None, memory: str | None = None,
              **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    c: dict[str, Any] = {"name": name, "image": "busybox", "resources": {"requests": requests}}
    c.update(extra)
    return c


def pod(name: str = "p", cpu: str | None = None, memory: str | None = None, *,
        namespace: str = "default", node_name: str | None = None,
        containers: list[dict[str, Any]] | None = None, init: list[dict[str, Any]] | None = None,
        phase: str | None = None, labels: dict[str, str] | None = None, owner: str | None = None,
        deleting: bool = False, **spec: Any) -> dict[str, Any]:
    """A pod; `owner` makes it controlled by an object of that kind (e.g. "ReplicaSet")."""
    s: dict[str, Any] = {"containers": containers or [container(cpu=cpu, memory=memory)]}
    if init:
        s["initContainers"] = init
    if node_name:
        s["nodeName"] = node_name
    s.update(spec)
    md: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if labels:
        md["labels"] = dict(labels)
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner",
                                  "uid": f"uid-{name}-owner", "controller": True}]
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    p: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": s, "status": {}}
    if phase:
        p["status"]["phase"] = phase
    return p


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def term(topology_key: str, *, match: dict[str, str] | None = None,
         exprs: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A PodAffinityTerm selecting `match` labels (and/or expressions) per `topology_key`."""
    selector: dict[str, Any] = {}
    if match is not None:
        selector["matchLabels"] = match
    if exprs is not None:
        selector["matchExpressions"] = exprs
    return {"labelSelector": selector, "topologyKey": topology_key, **extra}


def weighted(weight: int, t: dict[str, Any]) -> dict[str, Any]:
    return {"weight": weight, "podAffinityTerm": t}


def pod_affinity(*, required: list[dict[str, Any]] | None = None, preferred: list[dict[str, Any]] | None = None,
                 anti_required: list[dict[str, Any]] | None = None,
                 anti_preferred: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pod's `spec.affinity` with podAffinity / podAntiAffinity."""
    out: dict[str, Any] = {}
    if required or preferred:
        out["podAffinity"] = {k: v for k, v in (("requiredDuringSchedulingIgnoredDuringExecution", required),
                                                ("preferredDuringSchedulingIgnoredDuringExecution", preferred)) if v}
    if anti_required or anti_preferred:
        out["podAntiAffinity"] = {k: v for k, v in (
            ("requiredDuringSchedulingIgnoredDuringExecution", anti_required),
            ("preferredDuringSchedulingIgnoredDuringExecution", anti_preferred)) if v}
    return out


def spread(max_skew: int, topology_key: str, match: dict[str, str] | None, *,
           when: str = "DoNotSchedule", **extra: Any) -> dict[str, Any]:
    """A TopologySpreadConstraint; `match=None` leaves the labelSelector out."""
    c: dict[str, Any] = {"maxSkew": max_skew, "topologyKey": topology_key, "whenUnsatisfiable": when, **extra}
    if match is not None:
        c["labelSelector"] = {"matchLabels": match}
    return c


# ---------------------------------------------------------------------------
# Running one plugin the way the Framework does, over a whole snapshot.
# ---------------------------------------------------------------------------


def new_state(snap: Any, *, attach: bool = True) -> Any:
    """A CycleState; `attach` gives it the snapshot as the Framework does (`state.snapshot`)."""
    from fleet.scheduler.framework import CycleState

    state = CycleState()
    if attach:
        state.snapshot = snap  # type: ignore[attr-defined]
    return state


def filter_nodes(plugin: Any, p: dict[str, Any], snap: Any, *, attach: bool = True) -> dict[str, Any]:
    """node name -> Status of pre_filter + filter (a pre_filter rejection applies to every node)."""
    from fleet.scheduler.framework import Code, Status

    state = new_state(snap, attach=attach)
    if hasattr(plugin, "pre_filter"):
        pre = plugin.pre_filter(state, p)
        if pre.code is Code.SKIP:
            return {n.name: Status.success() for n in snap.nodes()}
        if not pre.ok:
            return {n.name: pre for n in snap.nodes()}
    return {n.name: plugin.filter(state, p, n) for n in snap.nodes()}


def feasible(plugin: Any, p: dict[str, Any], snap: Any, *, attach: bool = True) -> set[str]:
    return {name for name, st in filter_nodes(plugin, p, snap, attach=attach).items() if st.ok}


def score_nodes(plugin: Any, p: dict[str, Any], snap: Any, names: list[str] | None = None, *,
                attach: bool = True, normalize: bool = True) -> dict[str, int] | None:
    """node name -> score after pre_score, score and normalize; None when the plugin skips."""
    from fleet.scheduler.framework import Code

    state = new_state(snap, attach=attach)
    nodes = [n for n in snap.nodes() if names is None or n.name in names]
    if hasattr(plugin, "pre_score") and plugin.pre_score(state, p, nodes).code is Code.SKIP:
        return None
    scores = {n.name: plugin.score(state, p, n) for n in nodes}
    if normalize and hasattr(plugin, "normalize_score"):
        plugin.normalize_score(state, p, scores)
    return scores
