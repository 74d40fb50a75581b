"""The DaemonSet controller's decision, pure: which nodes run the daemon, and what a pass does.

`node_should_run` judges one node against the pod template plus the tolerations
every daemon pod gets (`add_daemon_tolerations`): should a pod be created there,
and may one already there stay.  `plan_daemonset(ds, nodes, pods, hash, now, act=...)`
is one pass of kube-controller-manager's syncDaemonSet without I/O — manage (one
non-failed pod on each fitting node, the oldest kept, none elsewhere), the
rolling update (maxSurge 0 or > 0, maxUnavailable, int or percentage) and the
status — returning a `DaemonSetPlan`; `daemon_pod` builds the pod it creates,
pinned to its node by a required node affinity.  The I/O loop that feeds and
applies it is `DaemonSetController` in `fleet/controllers/daemonset.py` (whose
docstring tells the whole behaviour); this module is table-tested in
tests/unit/controllers/test_daemonset.py.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api import owners
from fleet.api.nodeaffinity import required_node_affinity
from fleet.api.tolerations import untolerated
from fleet.controllers import history, podstate

API_VERSION = "apps/v1"
KIND = "DaemonSet"
HASH_LABEL = history.POD_REVISION_LABEL
TEMPLATE_GENERATION_LABEL = "pod-template-generation"
TEMPLATE_GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"
NODE_NAME_FIELD = "metadata.name"
HARD_EFFECTS = ("NoSchedule", "NoExecute")
DEFAULT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                           "effect": "NoSchedule"}
_PERCENT = re.compile(r"^([0-9]+)%$")


# ---------------------------------------------------------------------------------------
# Fitting a node


def add_daemon_tolerations(spec: dict[str, Any]) -> None:
    """AddOrUpdateDaemonPodTolerations: a toleration for the same key/operator/value/effect
    is replaced (so a limited tolerationSeconds becomes forever), others are appended."""
    tols = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    wanted = list(DEFAULT_TOLERATIONS)
    if spec.get("hostNetwork") is True:
        wanted.append(HOST_NETWORK_TOLERATION)

    def same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "operator", "value", "effect"))

    for w in wanted:
        for i, t in enumerate(tols):
            if same(t, w):
                tols[i] = dict(w)
                break
        else:
            tols.append(dict(w))
    spec["tolerations"] = tols


def daemon_spec(ds: Mapping[str, Any]) -> dict[str, Any]:
    """The template's pod spec with the DaemonSet tolerations (what each pod will carry)."""
    spec = copy.deepcopy(((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
    add_daemon_tolerations(spec)
    return spec


def node_should_run(ds_spec: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[bool, bool]:
    """(should_run, should_continue_running) for a node (NodeShouldRunDaemonPod).

    `ds_spec` is `daemon_spec(ds)`.  should_run: a node without the pod gets one.
    should_continue_running: a pod already there may stay (untolerated NoSchedule
    taints keep new pods off but do not evict; NoExecute ones do).
    """
    name = podstate.name_of(node)
    if ds_spec.get("nodeName") and ds_spec["nodeName"] != name:
        return False, False
    required = required_node_affinity(ds_spec)
    if required is not None and not required.matches(podstate.labels_of(node), name):
        return False, False
    taints = (node.get("spec") or {}).get("taints") or []
    tolerations = ds_spec.get("tolerations") or []
    if untolerated(taints, tolerations, HARD_EFFECTS):
        return False, not untolerated(taints, tolerations, ("NoExecute",))
    return True, True


def target_node(pod: Mapping[str, Any]) -> str | None:
    """The node a daemon pod is for: spec.nodeName, or its matchFields pin while unscheduled."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for f in (term or {}).get("matchFields") or []:
            if isinstance(f, dict) and f.get("key") == NODE_NAME_FIELD and f.get("operator") == "In" \
                    and len(f.get("values") or []) == 1:
                return str(f["values"][0])
    return None


def pin_to_node(spec: dict[str, Any], node: str) -> None:
    """ReplaceDaemonSetPodNodeNameNodeAffinity: the required node affinity becomes 'this node'."""
    term = {"matchFields": [{"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]}
    affinity = spec.get("affinity") if isinstance(spec.get("affinity"), dict) else {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity.get("nodeAffinity"), dict) else {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    required = required if isinstance(required, dict) else {}
    required["nodeSelectorTerms"] = [term]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = affinity


def scaled(value: Any, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent rounding up; bad values count as 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, str):
        m = _PERCENT.match(value)
        if m:
            return math.ceil(int(m.group(1)) * total / 100)
    return 0


@dataclass(frozen=True)
class Settings:
    rolling: bool
    max_surge_value: Any
    max_unavailable_value: Any
    min_ready: int

    @classmethod
    def of(cls, ds: Mapping[str, Any]) -> Settings:
        spec = ds.get("spec") or {}
        strategy = spec.get("updateStrategy") if isinstance(spec.get("updateStrategy"), dict) else {}
        rolling = (strategy.get("type") or "RollingUpdate") == "RollingUpdate"
        ru = strategy.get("rollingUpdate") if isinstance(strategy.get("rollingUpdate"), dict) else {}
        mrs = spec.get("minReadySeconds")
        return cls(rolling=rolling, max_surge_value=ru.get("maxSurge", 0) if rolling else 0,
                   max_unavailable_value=ru.get("maxUnavailable", 1) if rolling else 0,
                   min_ready=mrs if isinstance(mrs, int) and not isinstance(mrs, bool) and mrs > 0 else 0)

    @property
    def allows_surge(self) -> bool:
        return self.rolling and scaled(self.max_surge_value, 1) > 0

    def limits(self, desired: int) -> tuple[int, int]:
        """(maxSurge, maxUnavailable) for `desired` nodes; 1 unavailable if both came out 0."""
        surge = scaled(self.max_surge_value, desired) if self.rolling else 0
        unavailable = scaled(self.max_unavailable_value, desired) if self.rolling else 0
        if desired > 0 and surge == 0 and unavailable == 0:
            unavailable = 1
        return surge, unavailable


# ---------------------------------------------------------------------------------------
# The plan


@dataclass
class DaemonSetPlan:
    create_on: list[str] = field(default_factory=list)  # nodes that get a new pod
    delete: list[dict[str, Any]] = field(default_factory=list)
    failed: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (node, failed pod): back-off applies
    succeeded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    requeue_after: float | None = None


def _created_order(pod: Mapping[str, Any]) -> tuple[int, str, str]:
    """podByCreationTimestampAndPhase: scheduled pods first, then oldest, then by name."""
    md = pod.get("metadata") or {}
    return (0 if (pod.get("spec") or {}).get("nodeName") else 1, str(md.get("creationTimestamp") or ""),
            str(md.get("name") or ""))


def is_updated(pod: Mapping[str, Any], hash_: str, generation: str | None) -> bool:
    labels = podstate.labels_of(pod)
    return (bool(hash_) and labels.get(HASH_LABEL) == hash_) or \
        (generation is not None and labels.get(TEMPLATE_GENERATION_LABEL) == generation)


def pods_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The daemon pods of each node (deleted pods that have finished are left out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        if podstate.is_terminating(pod) and podstate.is_finished(pod):
            continue
        node = target_node(pod)
        if node is not None:
            out.setdefault(node, []).append(dict(pod))
    for lst in out.values():
        lst.sort(key=_created_order)
    return out


def plan_daemonset(ds: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                   hash_: str, now: float, *, act: bool = True) -> DaemonSetPlan:
    """What to do for `ds` (manage + rollingUpdate + updateDaemonSetStatus), pure.

    `pods` are the DaemonSet's own pods, `hash_` the current revision's hash,
    `now` the wall-clock time.  With `act=False` (the controller's earlier writes
    are not all visible yet) only the status is computed, without raising
    observedGeneration — Kubernetes' behaviour.
    """
    s = Settings.of(ds)
    generation = ((ds.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_GENERATION_ANNOTATION)
    spec = daemon_spec(ds)
    node_list = sorted((dict(n) for n in nodes), key=podstate.name_of)
    should = {podstate.name_of(n): node_should_run(spec, n) for n in node_list}
    by_node = pods_by_node(pods)
    plan = DaemonSetPlan()
    plan.status = _status(ds, node_list, should, by_node, hash_, generation, s, now, observed=act)
    waiting = [at for ps in by_node.values() for p in ps
               for at in [podstate.available_at(p, s.min_ready)] if at is not None and at > now]
    if waiting:
        plan.requeue_after = max(0.5, min(waiting) - now)
    if not act or podstate.is_terminating(ds):
        return plan

    going: set[str] = set()

    def delete(pod: dict[str, Any]) -> None:
        if podstate.uid_of(pod) not in going:
            going.add(podstate.uid_of(pod))
            plan.delete.append(pod)

    # manage: one (non-failed) pod on every node that should run one, none elsewhere.
    for node in node_list:
        name = podstate.name_of(node)
        should_run, should_continue = should[name]
        dpods = by_node.get(name, [])
        if should_run and not dpods:
            plan.create_on.append(name)
        elif should_continue:
            running = []
            for p in dpods:
                if podstate.is_terminating(p):
                    continue
                if podstate.phase(p) == "Failed":
                    plan.failed.append((name, p))
                    going.add(podstate.uid_of(p))
                elif podstate.phase(p) == "Succeeded":
                    plan.succeeded.append((name, p))
                    delete(p)
                else:
                    running.append(p)
            if not s.allows_surge:
                for p in running[1:]:  # keep the oldest
                    delete(p)
            elif not running:
                if should_run:
                    plan.create_on.append(name)
            elif len(running) > 1:
                # Surging: one old and one new pod may overlap until the new one is available.
                newest_ok: dict[str, Any] | None = None
                oldest_old: dict[str, Any] | None = None
                for p in running:
                    if is_updated(p, hash_, generation):
                        if newest_ok is None:
                            newest_ok = p
                            continue
                    elif oldest_old is None:
                        oldest_old = p
                        continue
                    delete(p)
                if newest_ok is not None and oldest_old is not None and (
                        not podstate.is_ready(oldest_old)
                        or podstate.is_available(newest_ok, s.min_ready, now)):
                    delete(oldest_old)
        else:
            for p in dpods:
                if not podstate.is_terminating(p):
                    delete(p)
    # Unscheduled pods aimed at nodes that no longer exist would wait forever.
    for node_name, dpods in by_node.items():
        if node_name not in should:
            for p in dpods:
                if not (p.get("spec") or {}).get("nodeName") and not podstate.is_terminating(p):
                    delete(p)

    if s.rolling:
        _rolling_update(plan, s, should, by_node, going, hash_, generation, now, delete)
    return plan


def _rolling_update(plan: DaemonSetPlan, s: Settings, should: Mapping[str, tuple[bool, bool]],
                    by_node: Mapping[str, list[dict[str, Any]]], going: set[str], hash_: str,
                    generation: str | None, now: float, delete: Callable[[dict[str, Any]], None]) -> None:
    desired = sum(1 for run, _ in should.values() if run)
    max_surge, max_unavailable = s.limits(desired)
    nodes = sorted(set(by_node) | {n for n, (run, _) in should.items() if run})

    def on_node(name: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
        """(new pod, old pod, at most one of each) among the node's live pods (findUpdatedPodsOnNode)."""
        new = old = None
        for p in by_node.get(name, []):
            if podstate.is_terminating(p) or podstate.uid_of(p) in going:
                continue
            if is_updated(p, hash_, generation):
                if new is not None:
                    return None, None, False
                new = p
            else:
                if old is not None:
                    return None, None, False
                old = p
        return new, old, True

    def available(p: Mapping[str, Any]) -> bool:
        return podstate.is_available(p, s.min_ready, now)

    if max_surge == 0:
        # Delete just enough old pods to stay within maxUnavailable; manage re-creates them.
        unavailable = 0
        replace: list[dict[str, Any]] = []
        candidates: list[dict[str, Any]] = []
        for name in nodes:
            new, old, ok = on_node(name)
            if not ok or (new is None) == (old is None):
                unavailable += 1  # manage is still sorting this node out
            elif new is not None:
                unavailable += not available(new)
            else:
                assert old is not None
                if not available(old):
                    replace.append(old)  # already down: replacing it costs nothing
                    unavailable += 1
                elif unavailable < max_unavailable:
                    candidates.append(old)
        budget = min(max(0, max_unavailable - unavailable), len(candidates))
        for p in replace + candidates[:budget]:
            delete(p)
        return

    # Surge: start new pods beside old ones (at most maxSurge waiting at once) and remove
    # each old pod once its replacement is available.
    surging = available_count = 0
    allowed_new: list[str] = []
    candidate_new: list[str] = []
    unneeded: list[dict[str, Any]] = []
    for name in nodes:
        new, old, ok = on_node(name)
        if not ok:
            surging += 1
            continue
        if old is not None:
            available_count += available(old)
        elif new is not None:
            available_count += available(new)
        if old is None:
            continue
        run = should.get(name, (False, False))[0]
        if new is None:
            if not available(old):
                if not run:
                    delete(old)
                else:
                    allowed_new.append(name)
            elif not run:
                unneeded.append(old)
            elif surging < max_surge:
                candidate_new.append(name)
        elif not available(new):
            surging += 1
        else:
            delete(old)
    # Old pods on nodes that should no longer run the daemon go only while enough others are available.
    deletable = available_count - desired
    for p in unneeded[:max(0, deletable)]:
        delete(p)
    budget = min(max(0, max_surge - surging), len(candidate_new))
    plan.create_on.extend(allowed_new + candidate_new[:budget])


def _status(ds: Mapping[str, Any], nodes: list[dict[str, Any]], should: Mapping[str, tuple[bool, bool]],
            by_node: Mapping[str, list[dict[str, Any]]], hash_: str, generation: str | None, s: Settings,
            now: float, *, observed: bool) -> dict[str, Any]:
    desired = current = misscheduled = ready = updated = available = 0
    for node in nodes:
        name = podstate.name_of(node)
        dpods = by_node.get(name, [])
        if should[name][0]:
            desired += 1
            if not dpods:
                continue
            current += 1
            pod = dpods[0]
            if podstate.is_ready(pod):
                ready += 1
                available += podstate.is_available(pod, s.min_ready, now)
            updated += is_updated(pod, hash_, generation)
        elif dpods:
            misscheduled += 1
    status: dict[str, Any] = {
        "desiredNumberScheduled": desired, "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled, "numberReady": ready, "updatedNumberScheduled": updated,
        "numberAvailable": available, "numberUnavailable": desired - available,
    }
    if observed:
        status["observedGeneration"] = (ds.get("metadata") or {}).get("generation") or 0
    return status


def daemon_pod(ds: Mapping[str, Any], hash_: str, node: str) -> dict[str, Any]:
    """A new pod for `node` (CreatePodTemplate + the node pin)."""
    template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
    template["spec"] = daemon_spec(ds)
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels[HASH_LABEL] = hash_
    generation = ((ds.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_GENERATION_ANNOTATION)
    if generation is not None:
        labels[TEMPLATE_GENERATION_LABEL] = str(generation)
    template.setdefault("metadata", {})["labels"] = labels
    md = ds.get("metadata") or {}
    pod = podstate.pod_from_template(template, str(md.get("namespace") or ""),
                                     owners.controller_ref(ds, api_version=API_VERSION, kind=KIND))
    pod["metadata"]["generateName"] = f"{md.get('name')}-"
    pin_to_node(pod["spec"], node)
    return pod


def status_changed(ds: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    have = ds.get("status") or {}
    return any(have.get(k, 0) != val for k, val in status.items())
