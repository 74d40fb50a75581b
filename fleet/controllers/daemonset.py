"""DaemonSet controller: one pod on every node that should run it, following nodes as they come and go.

As kube-controller-manager's daemonset controller:

* **Which nodes.** A node should run the daemon when the pod template fits it:
  `spec.nodeName` (if set) names it, `nodeSelector` and required node affinity
  match its labels (matchFields on `metadata.name`), and the pod tolerates its
  NoSchedule/NoExecute taints.  Before judging, the template gets the
  tolerations every DaemonSet pod gets — not-ready and unreachable NoExecute
  forever (a daemon must survive its node's trouble), disk-, memory- and
  pid-pressure and unschedulable NoSchedule (daemons run on cordoned nodes),
  network-unavailable NoSchedule for hostNetwork pods.  A pod already running
  on a node that only gained an untolerated NoSchedule taint may stay; an
  untolerated NoExecute taint (or a changed label) removes it.
* **Placement through the scheduler.** Pods are created with a required node
  affinity `matchFields metadata.name In [<node>]` (Kubernetes since 1.12), so
  the ordinary scheduler binds them — resources, ports and priorities are
  checked once, in one place.
* **Nodes coming and going.** Node events re-evaluate every DaemonSet: a
  joining node gets its pod, a node whose labels or taints no longer fit loses
  it; pods of a deleted node are removed by the pod garbage collector (node
  lifecycle controller), and unscheduled pods aimed at it by this controller.
  Failed daemon pods are deleted and re-created, with a per-node back-off so a
  node that keeps rejecting the pod is not hot-looped.
* **Updates.** Each template is a ControllerRevision; pods carry its hash in
  `controller-revision-hash`.  `RollingUpdate` with `maxSurge: 0` deletes old
  pods while at most `maxUnavailable` (int or %, rounded up) nodes lack an
  available up-to-date pod; with `maxSurge` > 0 it starts the new pod beside the
  old one (at most maxSurge at once) and deletes the old pod once the new one is
  available.  `OnDelete` waits for users to delete pods.
* **Status**: desired/current/misscheduled/ready/updated/available/unavailable
  counts and `observedGeneration` (only once the controller's own writes have
  been seen), which `kubectl rollout status daemonset/x` reads.

`plan_daemonset` is the pure decision; `DaemonSetController.reconcile` feeds it
the caches, keeps the history and applies it (creations in slow-start batches,
as Kubernetes does, so a refusing API is not flooded).
"""

from __future__ import annotations

import copy
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import owners
from fleet.api.nodeaffinity import required_node_affinity
from fleet.api.tolerations import toleration_matches, untolerated  # noqa: F401 - re-exported
from fleet.client import MERGE_PATCH, ApiException
from fleet.controllers import history, podstate
from fleet.controllers.runtime import (
    OWNED_INDEX,
    Context,
    Expectations,
    QueueWorker,
    SharedInformer,
    claim_owned,
    controller_key,
    index_claimable,
    key_of,
    split_key,
)

log = logging.getLogger(__name__)

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
BURST_REPLICAS = 250  # creations/deletions per reconcile (kube-controller-manager's burstReplicas)
FAILED_BACKOFF_INITIAL, FAILED_BACKOFF_MAX = 1.0, 900.0
EXPECTATIONS_RECHECK = 5.0
WRITE_CONCURRENCY = 16  # pod creations/deletions in flight at once
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


async def slow_start(items: Sequence[Any], fn: Callable[[Any], Awaitable[None]], *,
                     concurrency: int = WRITE_CONCURRENCY) -> tuple[int, list[Exception]]:
    """Run fn over items in batches of 1, 2, 4, … concurrently; stop after a batch with errors.

    Returns (how many were attempted, the errors).  If the API refuses one
    create (a quota, a bad template) it will refuse the rest: one failed call,
    not a thousand (controller.slowStartBatch).  At most `concurrency` calls are
    in flight, so a thousand-node cluster does not flood the API server."""
    done = 0
    batch = 1
    errors: list[Exception] = []
    limiter = trio.CapacityLimiter(concurrency)
    while done < len(items) and not errors:
        chunk = items[done:done + batch]
        async with trio.open_nursery() as n:
            for item in chunk:
                n.start_soon(_collect, fn, item, errors, limiter)
        done += len(chunk)
        batch *= 2
    return done, errors


# ---------------------------------------------------------------------------------------
# The controller


@dataclass
class _Backoff:
    delay: float
    until: float


class DaemonSetController(QueueWorker):
    name = "daemonset"
    workers = 2

    def __init__(self) -> None:
        super().__init__()
        self.expectations = Expectations()
        self._failed_backoff: dict[str, _Backoff] = {}

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.sets: SharedInformer = ctx.informers.informer(API_VERSION, "daemonsets")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.nodes: SharedInformer = ctx.informers.informer("v1", "nodes")
        self.revisions: SharedInformer = ctx.informers.informer(API_VERSION, "controllerrevisions")
        for inf in (self.pods, self.revisions):
            index_claimable(inf)
        self.sets.add_handler(self._on_set)
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(self._on_node)
        self.revisions.add_handler(self._on_revision)

    # -- event handlers ----------------------------------------------------------------------
    def _on_set(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        if etype == "DELETED":
            self.expectations.forget(key_of(obj))
            prefix = f"{podstate.uid_of(obj)}/"
            for bkey in [k for k in self._failed_backoff if k.startswith(prefix)]:
                del self._failed_backoff[bkey]
        self.queue.add(key_of(obj))

    @staticmethod
    def _owner_key(obj: Mapping[str, Any] | None) -> str | None:
        return controller_key(obj, API_VERSION, KIND)

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        if pod is None:
            return
        key = self._owner_key(pod)
        if etype == "ADDED" and key:
            self.expectations.creation_observed(key)
        if key and (etype == "DELETED" or (podstate.is_terminating(pod)
                                          and not (old is not None and podstate.is_terminating(old)))):
            self.expectations.deletion_observed(key, podstate.uid_of(pod))
        for k in {key, self._owner_key(old)} - {None}:
            self.queue.add(k)  # type: ignore[arg-type]
        if key is None and etype != "DELETED" and not podstate.is_terminating(pod):
            ns = (pod.get("metadata") or {}).get("namespace") or ""
            labels = podstate.labels_of(pod)
            for ds in self.sets.list(ns):
                if podstate.selector_matches((ds.get("spec") or {}).get("selector"), labels):
                    self.queue.add(key_of(ds))

    @staticmethod
    def _fit_facts(node: Mapping[str, Any] | None) -> Any:
        """What of a node decides whether daemons run there (heartbeats do not)."""
        if node is None:
            return None
        spec = node.get("spec") or {}
        return (podstate.labels_of(node), spec.get("taints"), spec.get("unschedulable"))

    def _on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "MODIFIED" and self._fit_facts(old) == self._fit_facts(new):
            return
        for ds in self.sets.list():
            self.queue.add(key_of(ds))

    def _on_revision(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for obj in (old, new):
            key = self._owner_key(obj)
            if key:
                self.queue.add(key)

    # -- reconcile ----------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        ds = self.sets.get(key)
        if ds is None:
            self.expectations.forget(key)
            return None
        selector = (ds.get("spec") or {}).get("selector")
        if not isinstance(selector, dict) or not podstate.uid_of(ds):
            return None
        if podstate.is_terminating(ds):
            # The garbage collector is removing its pods and history; nothing to keep up.
            return None
        ns, _ = split_key(key)
        revisions = await self._claim_revisions(ds, ns)
        current, old, collision = await self._construct_history(ds, revisions)
        hash_ = podstate.labels_of(current).get(HASH_LABEL) or podstate.name_of(current)
        pods = await self._claim_pods(ds, ns)
        act = self.expectations.satisfied(key)
        plan = plan_daemonset(ds, self.nodes.list(), pods, hash_, time.time(), act=act)
        again = plan.requeue_after
        try:
            if act:
                again = _min(again, await self._apply(key, ds, hash_, plan))
        finally:
            status = dict(plan.status)
            if collision != _int((ds.get("status") or {}).get("collisionCount")):
                status["collisionCount"] = collision
            await self._write_status(ds, status)
        if act:
            await self._cleanup_history(ds, old, pods)
        return again if act else _min(again, EXPECTATIONS_RECHECK)

    async def _claim_pods(self, ds: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        selector = (ds.get("spec") or {}).get("selector")
        return await claim_owned(
            self.ctx.client, self.pods, ds, ns,
            lambda p: podstate.selector_matches(selector, podstate.labels_of(p)),
            api_version=API_VERSION, kind=KIND, resource=("v1", "pods"))

    async def _claim_revisions(self, ds: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        selector = (ds.get("spec") or {}).get("selector")
        return await claim_owned(
            self.ctx.client, self.revisions, ds, ns,
            lambda r: podstate.selector_matches(selector, podstate.labels_of(r)),
            api_version=API_VERSION, kind=KIND, resource=(API_VERSION, "controllerrevisions"),
            release=False)

    async def _construct_history(self, ds: dict[str, Any], revisions: list[dict[str, Any]]
                                 ) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
        """(current revision, older revisions, collisionCount) — constructHistory."""
        ns = (ds.get("metadata") or {}).get("namespace") or ""
        client = self.ctx.client
        data = history.template_patch(ds)
        collision = _int((ds.get("status") or {}).get("collisionCount"))
        current = [r for r in revisions if history.same_data(r, data)]
        old = [r for r in revisions if not history.same_data(r, data)]
        n = max((history.number(r) for r in old), default=0) + 1
        if not current:
            template = (ds.get("spec") or {}).get("template") or {}
            hash_ = history.hash_data(template, collision)
            body = history.build_revision(
                ds, owners.controller_ref(ds, api_version=API_VERSION, kind=KIND), data, n,
                name=history.revision_name(podstate.name_of(ds), hash_),
                labels={**((template.get("metadata") or {}).get("labels") or {}), HASH_LABEL: hash_},
                annotations=(ds.get("metadata") or {}).get("annotations"))
            try:
                return await client.create(API_VERSION, "controllerrevisions", body, ns), old, collision
            except ApiException as e:
                if e.code != 409:
                    raise
            existing = await client.get_object(API_VERSION, "controllerrevisions", body["metadata"]["name"], ns)
            if history.same_data(existing, data):
                return existing, old, collision
            await client.patch(API_VERSION, "daemonsets", podstate.name_of(ds),
                               {"status": {"collisionCount": collision + 1}}, MERGE_PATCH, ns,
                               subresource="status")
            raise RuntimeError(f"revision name {body['metadata']['name']} collides; collisionCount raised")
        keep = max(current, key=history.number)
        keep_hash = podstate.labels_of(keep).get(HASH_LABEL) or podstate.name_of(keep)
        for dup in current:
            if dup is keep:
                continue
            # Duplicates of the live template (a rollback raced a rollout): relabel their pods, drop them.
            dup_hash = podstate.labels_of(dup).get(HASH_LABEL)
            for pod in self.pods.by_index(OWNED_INDEX, podstate.uid_of(ds)):
                if dup_hash and podstate.labels_of(pod).get(HASH_LABEL) == dup_hash:
                    await client.patch("v1", "pods", podstate.name_of(pod),
                                       {"metadata": {"labels": {HASH_LABEL: keep_hash}}}, MERGE_PATCH, ns)
            try:
                await client.delete(API_VERSION, "controllerrevisions", podstate.name_of(dup), ns)
            except ApiException as e:
                if e.code != 404:
                    raise
        if history.number(keep) < n:
            keep = await client.patch(API_VERSION, "controllerrevisions", podstate.name_of(keep),
                                      {"revision": n}, MERGE_PATCH, ns)
        return keep, old, collision

    async def _apply(self, key: str, ds: dict[str, Any], hash_: str, plan: DaemonSetPlan) -> float | None:
        """Carry out the plan; returns when to look again for back-offs (None: no need)."""
        ns, name = split_key(key)
        client, events = self.ctx.client, self.ctx.events
        deletes = list(plan.delete)
        again: float | None = None
        now = trio.current_time()
        for node, pod in plan.failed:
            bkey = f"{podstate.uid_of(ds)}/{node}"
            b = self._failed_backoff.get(bkey)
            if b is not None and now < b.until:
                again = _min(again, b.until - now)
                continue
            # A node that has behaved for a long while starts over (client-go Backoff's GC).
            fresh = b is None or now - b.until > 2 * FAILED_BACKOFF_MAX
            delay = FAILED_BACKOFF_INITIAL if fresh or b is None else min(b.delay * 2, FAILED_BACKOFF_MAX)
            self._failed_backoff[bkey] = _Backoff(delay, now + delay)
            events.record(ds, "Warning", "FailedDaemonPod",
                          f"Found failed daemon pod {ns}/{podstate.name_of(pod)} on node {node}, will try to kill it")
            deletes.append(pod)
        for node, pod in plan.succeeded:
            events.record(ds, "Normal", "SucceededDaemonPod",
                          f"Found succeeded daemon pod {ns}/{podstate.name_of(pod)} on node {node}, "
                          "will try to delete it")
        create_on = plan.create_on[:BURST_REPLICAS]
        wanted = len(deletes)
        deletes = deletes[:BURST_REPLICAS]
        if create_on:
            self.expectations.expect_creations(key, len(create_on))
        if deletes:
            self.expectations.expect_deletions(key, [podstate.uid_of(p) for p in deletes])

        async def create(node: str) -> None:
            try:
                pod = await client.create("v1", "pods", daemon_pod(ds, hash_, node), ns)
            except BaseException as e:
                self.expectations.creation_failed(key)
                if isinstance(e, ApiException):
                    events.record(ds, "Warning", "FailedCreate", f"Error creating: {e}")
                raise
            events.record(ds, "Normal", "SuccessfulCreate", f"Created pod: {podstate.name_of(pod)}")

        attempted, errors = await slow_start(create_on, create)
        for _ in range(len(create_on) - attempted):
            self.expectations.creation_failed(key)  # never attempted: not to be waited for

        async def delete(pod: dict[str, Any]) -> None:
            pname, uid = podstate.name_of(pod), podstate.uid_of(pod)
            try:
                await client.delete("v1", "pods", pname, ns, body={"preconditions": {"uid": uid}})
            except BaseException as e:
                self.expectations.deletion_observed(key, uid)
                if isinstance(e, ApiException) and e.code in (404, 409):
                    return
                if isinstance(e, ApiException):
                    events.record(ds, "Warning", "FailedDelete", f"Error deleting: {e}")
                raise
            events.record(ds, "Normal", "SuccessfulDelete", f"Deleted pod: {pname}")

        limiter = trio.CapacityLimiter(WRITE_CONCURRENCY)
        async with trio.open_nursery() as n:
            for pod in deletes:
                n.start_soon(_collect, delete, pod, errors, limiter)
        if errors:
            raise errors[0]
        if len(plan.create_on) > len(create_on) or wanted > len(deletes):
            again = 0.0  # more than one burst's worth: continue at once
        log.debug("daemonset %s: created %d, deleted %d", name, len(create_on), len(deletes))
        return again

    async def _write_status(self, ds: dict[str, Any], status: dict[str, Any]) -> None:
        if not status_changed(ds, status):
            return
        ns = (ds.get("metadata") or {}).get("namespace") or ""
        try:
            await self.ctx.client.patch(API_VERSION, "daemonsets", podstate.name_of(ds), {"status": status},
                                        MERGE_PATCH, ns, subresource="status")
        except ApiException as e:
            if e.code != 404:
                raise

    async def _cleanup_history(self, ds: dict[str, Any], old: list[dict[str, Any]],
                               pods: list[dict[str, Any]]) -> None:
        limit = _int((ds.get("spec") or {}).get("revisionHistoryLimit"), 10)
        live_hashes = {podstate.labels_of(p).get(HASH_LABEL) for p in pods} - {None}
        live = {podstate.name_of(r) for r in old if podstate.labels_of(r).get(HASH_LABEL) in live_hashes}
        ns = (ds.get("metadata") or {}).get("namespace") or ""
        excess = len(old) - limit
        if excess <= 0:
            return
        for r in history.history_to_delete(old, live, 0)[:excess]:
            try:
                await self.ctx.client.delete(API_VERSION, "controllerrevisions", podstate.name_of(r), ns)
            except ApiException as e:
                if e.code != 404:
                    raise


async def _collect(fn: Callable[[Any], Awaitable[None]], item: Any, errors: list[Exception],
                   limiter: trio.CapacityLimiter) -> None:
    async with limiter:
        try:
            await fn(item)
        except Exception as e:  # noqa: BLE001 - reported together by the caller
            errors.append(e)


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
