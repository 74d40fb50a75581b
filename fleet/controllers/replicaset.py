"""ReplicaSet and ReplicationController controllers: keep `spec.replicas` pods of the template alive.

As kube-controller-manager's replicaset controller, in two layers:

* `plan(rs, pods, now=...)` — the whole decision, pure: which orphans matching
  the selector to adopt, which owned pods the selector no longer matches to
  release, how many pods to create, which to delete (ranked the way Kubernetes
  ranks them) and the status those pods amount to.  Tested table-driven.
* `ReplicaSetController` — a QueueWorker that feeds `plan` from the informer
  caches and carries it out through the API.

Both layers serve two kinds through a `ReplicaKind` strategy: `apps/v1`
ReplicaSets (`REPLICA_SET`) and core `v1` ReplicationControllers
(`REPLICATION_CONTROLLER`, run as the `replicationcontroller` controller by
`ReplicationManager`).  They differ only in their group-version-kind and their
selector's form — a LabelSelector, or an RC's equality-based map, read as
`matchLabels` — exactly as kube-controller-manager runs its replication manager:
the ReplicaSet controller's code over RCs converted to ReplicaSets.

Why the pieces are shaped this way:

* **Expectations.**  Pods we create or delete show up in the pod informer a
  little later; reconciling before they do would create (or delete) them a second
  time.  So `plan` only acts on counts when the controller's expectations are
  satisfied; until then it only reports status.  A pod counts as deleted as soon
  as it carries a deletionTimestamp — a replacement is started while the old pod
  is still shutting down, as in Kubernetes.
* **Slow start.**  Creates go out in batches of 1, 2, 4, ... and stop at the first
  failure, so a ReplicaSet that cannot create pods (quota, admission) costs one
  failed request per attempt, not `replicas` of them.  At most `BURST_REPLICAS`
  pods are created or deleted per pass.
* **Deletion order** (`deletion_order`): unscheduled before scheduled, Pending
  before Unknown before Running, not ready before ready, lower
  `controller.kubernetes.io/pod-deletion-cost` first, pods on nodes crowded with
  pods of the same owner first, then the most recently ready, the most restarted
  and the newest — on a logarithmic time scale with a uid tie-break, so scale-down
  does not always hit the same node or the same generation of pods.
* **Status** is written with a merge patch that carries `observedGeneration`
  (the generation the decision was made for), so a concurrent spec update is
  never hidden: the controller never claims to have seen a generation it has not.
  Zero counts are left out, as the Kubernetes API omits them.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import meta, owners
from fleet.api.conditions import find, is_pod_ready, pod_ready_condition
from fleet.api.errors import BadRequest
from fleet.api.selectors import LabelSelector, parsed_label_selector
from fleet.client import (
    JSON_PATCH,
    MERGE_PATCH,
    ApiException,
    Client,
    ClientConfig,
    resource_path,
)
from fleet.client.fast import FastConnection
from fleet.controllers.runtime import (
    Context,
    Expectations,
    QueueWorker,
    SharedInformer,
    by_controller_uid,
    key_of,
    namespace_terminating,
)

log = logging.getLogger(__name__)

BURST_REPLICAS = 500  # kube-controller-manager's burstReplicas
# Pod creates and deletes in flight at once, over all ReplicaSets (one kept-alive
# connection each, see PodWriter).  With the API server in the same process more
# would not be faster.  (kube-controller-manager is held to 20 requests/s by default.)
API_CONCURRENCY = 16
SLOW_START_INITIAL_BATCH = 1
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# The API server cuts generateName bases to this length, leaving room for 5 random chars.
MAX_GENERATED_BASE = 58
API_VERSION, KIND = "apps/v1", "ReplicaSet"
CONTROLLER_INDEX = "controller-uid"
ORPHAN_INDEX = "orphans-by-namespace"
FAILURE = "ReplicaFailure"


# ---------------------------------------------------------------------------------------
# Small pure helpers over pods (the Deployment controller uses them too)


parse_time = meta.parse_epoch  # RFC 3339 → epoch seconds, None when absent or bad


rfc3339 = meta.format_time


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def pod_active(pod: Mapping[str, Any]) -> bool:
    """Neither finished nor being deleted: a pod that still counts as a replica."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not meta(pod).get("deletionTimestamp")


def pod_ready_since(pod: Mapping[str, Any]) -> float | None:
    """When a ready pod last became ready (None if not ready or not recorded)."""
    c = pod_ready_condition(pod)
    if c is None or c.get("status") != "True":
        return None
    return parse_time(c.get("lastTransitionTime"))


def pod_available(pod: Mapping[str, Any], min_ready_seconds: int, now: float) -> bool:
    """Ready for longer than minReadySeconds (ready is enough when it is 0)."""
    if not is_pod_ready(pod):
        return False
    if min_ready_seconds <= 0:
        return True
    since = pod_ready_since(pod)
    return since is not None and since + min_ready_seconds < now


def max_restarts(pod: Mapping[str, Any]) -> int:
    return max((int(c.get("restartCount") or 0)
                for c in (pod.get("status") or {}).get("containerStatuses") or []
                if isinstance(c, dict)), default=0)


def selector_of(obj: Mapping[str, Any]) -> LabelSelector:
    """The parsed `spec.selector` (memoized: controllers test it on every pod event)."""
    try:
        return parsed_label_selector((obj.get("spec") or {}).get("selector"))
    except BadRequest:  # an unparsable selector selects nothing
        return LabelSelector(nothing=True)


def selects(owner: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    return selector_of(owner).matches(meta(obj).get("labels") or {})


def map_selector_of(obj: Mapping[str, Any]) -> LabelSelector:
    """A ReplicationController's `spec.selector` (a label map) as a selector, the way
    kube's RC-to-ReplicaSet conversion reads it: `matchLabels`."""
    sel = (obj.get("spec") or {}).get("selector")
    if not isinstance(sel, dict):
        return LabelSelector(nothing=True)
    try:
        return parsed_label_selector({"matchLabels": sel})
    except BadRequest:
        return LabelSelector(nothing=True)


@dataclass(frozen=True)
class ReplicaKind:
    """What differs between the kinds this controller keeps (the strategy)."""

    api_version: str
    kind: str
    plural: str
    selector: Callable[[Mapping[str, Any]], LabelSelector]

    def selects(self, owner: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
        return self.selector(owner).matches(meta(obj).get("labels") or {})


REPLICA_SET = ReplicaKind(API_VERSION, KIND, "replicasets", selector_of)
REPLICATION_CONTROLLER = ReplicaKind("v1", "ReplicationController", "replicationcontrollers",
                                     map_selector_of)


def slow_start_batches(count: int, initial: int = SLOW_START_INITIAL_BATCH) -> list[int]:
    """The batch sizes `count` creations go out in: 1, 2, 4, ... (the last one smaller)."""
    out: list[int] = []
    batch = min(count, initial)
    while batch > 0:
        out.append(batch)
        count -= batch
        batch = min(2 * batch, count)
    return out


# ---------------------------------------------------------------------------------------
# Which pods go first when scaling down


_PHASE_ORDER = {"Pending": 0, "Unknown": 1, "Running": 2}


def _log_rank(t: float | None, now: float) -> int | None:
    if t is None:
        return None
    age = now - t
    return int(math.log2(age * 1e9)) if age > 0 else -1  # nanoseconds, as Go's Duration


def _time_key(t: float | None, now: float) -> tuple[int, float]:
    """Sort key putting a missing time first, then the most recent (log-scaled) first."""
    if t is None:
        return (0, 0.0)
    rank = _log_rank(t, now)
    return (1, float(rank if rank is not None else 0))


def deletion_order(pods: Iterable[Mapping[str, Any]], related: Iterable[Mapping[str, Any]] = (),
                   now: float | None = None) -> list[dict[str, Any]]:
    """`pods` sorted so the ones to delete first come first (Kubernetes' ranking).

    `related` are the active pods of the same owner family (all ReplicaSets of one
    Deployment): a pod on a node crowded with them goes before one on a node where
    it is alone, which spreads what is left.
    """
    now = time.time() if now is None else now
    crowd: dict[str, int] = {}
    for p in related:
        if pod_active(p):
            node = (p.get("spec") or {}).get("nodeName") or ""
            crowd[node] = crowd.get(node, 0) + 1

    def key(p: Mapping[str, Any]) -> tuple[Any, ...]:
        spec = p.get("spec") or {}
        node = spec.get("nodeName") or ""
        ready = is_pod_ready(p)
        try:
            cost = int(str((meta(p).get("annotations") or {}).get(DELETION_COST, "0")))
        except ValueError:
            cost = 0
        ready_key = _time_key(pod_ready_since(p), now) if ready else (0, 0.0)
        created = _time_key(parse_time(meta(p).get("creationTimestamp")), now)
        return (
            1 if node else 0,                                          # unscheduled first
            _PHASE_ORDER.get((p.get("status") or {}).get("phase") or "", 0),  # Pending < Unknown < Running
            1 if ready else 0,                                         # not ready first
            cost,                                                      # cheaper first
            -crowd.get(node, 0),                                       # crowded nodes first
            ready_key,                                                 # ready most recently first
            -max_restarts(p),                                          # more restarts first
            created,                                                   # newest first
            str(meta(p).get("uid") or ""),
        )

    return [dict(p) for p in sorted(pods, key=key)]


# ---------------------------------------------------------------------------------------
# Status


def compute_status(rs: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], now: float,
                   failure: tuple[str, str] | None = None) -> dict[str, Any]:
    """What `pods` (the active pods the ReplicaSet owns) amount to.

    `failure` is (reason, message) of a failed create or delete in this pass: it
    becomes the ReplicaFailure condition (kept as first reported while failures go
    on), which disappears after a pass without one.
    """
    spec = rs.get("spec") or {}
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    min_ready = int(spec.get("minReadySeconds") or 0)
    total = labeled = ready = available = 0
    for p in pods:
        total += 1
        labels = meta(p).get("labels") or {}
        if all(labels.get(k) == v for k, v in template_labels.items()):
            labeled += 1
        if is_pod_ready(p):
            ready += 1
            if pod_available(p, min_ready, now):
                available += 1
    old = dict(rs.get("status") or {})
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, dict)]
    current = find(old.get("conditions"), FAILURE)
    if failure is not None and current is None:
        conditions.append({"type": FAILURE, "status": "True", "lastTransitionTime": rfc3339(now),
                           "reason": failure[0], "message": failure[1]})
    elif failure is None and current is not None:
        conditions = [c for c in conditions if c.get("type") != FAILURE]
    status: dict[str, Any] = {"replicas": total}
    for k, n in (("fullyLabeledReplicas", labeled), ("readyReplicas", ready),
                 ("availableReplicas", available)):
        if n:
            status[k] = n
    gen = meta(rs).get("generation")
    if gen is not None:
        status["observedGeneration"] = gen
    if conditions:
        status["conditions"] = conditions
    return status


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch turning status `old` into `new` (None when they are equal)."""
    old = old or {}
    if dict(old) == dict(new):
        return None
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for k in old:
        if k not in new:
            patch[k] = None
    return patch


# ---------------------------------------------------------------------------------------
# The decision


@dataclass
class ReplicaSetPlan:
    """What one pass of the controller does for one ReplicaSet, in order."""

    adopt: list[dict[str, Any]] = field(default_factory=list)    # orphans to own
    release: list[dict[str, Any]] = field(default_factory=list)  # owned, no longer selected
    create: int = 0                                              # pods to create
    delete: list[dict[str, Any]] = field(default_factory=list)   # pods to delete, in order
    status: dict[str, Any] = field(default_factory=dict)         # status if all goes well
    requeue_after: float | None = None                           # look again (minReadySeconds)
    owned: list[dict[str, Any]] = field(default_factory=list)    # active pods it owns after adoption


def plan(rs: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], *, now: float,
         expectations_satisfied: bool = True, related: Iterable[Mapping[str, Any]] | None = None,
         burst: int = BURST_REPLICAS, kind: ReplicaKind = REPLICA_SET) -> ReplicaSetPlan:
    """Decide one pass for `rs` (a ReplicaSet, or what `kind` says) from `pods` (its own
    pods and the namespace's orphans).

    Pods owned by another controller are ignored; finished or terminating pods do
    not count.  Creations and deletions wait for `expectations_satisfied`, and
    nothing is adopted, released, created or deleted once the ReplicaSet is being
    deleted (the garbage collector is taking its pods away).
    """
    out = ReplicaSetPlan()
    deleting = bool(meta(rs).get("deletionTimestamp"))
    sel = kind.selector(rs)
    active = [dict(p) for p in pods if pod_active(p)]
    owned, out.adopt, out.release = owners.claim(rs, active,
                                                 lambda p: sel.matches(meta(p).get("labels") or {}))
    taken = {id(p) for p in (*owned, *out.adopt)}
    out.owned = [p for p in active if id(p) in taken]  # in the order the pods came
    want = int((rs.get("spec") or {}).get("replicas", 1) or 0)
    if expectations_satisfied and not deleting:
        diff = len(out.owned) - want
        if diff < 0:
            out.create = min(-diff, burst)
        elif diff > 0:
            rel = list(related) if related is not None else out.owned
            out.delete = deletion_order(out.owned, rel, now)[:min(diff, burst)]
    out.status = compute_status(rs, out.owned, now)
    out.requeue_after = next_availability(rs, out.owned, now)
    return out


def next_availability(rs: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                      now: float) -> float | None:
    """Seconds until the first ready pod passes minReadySeconds (None: nothing to wait for)."""
    min_ready = int((rs.get("spec") or {}).get("minReadySeconds") or 0)
    if min_ready <= 0:
        return None
    soonest: float | None = None
    for p in pods:
        since = pod_ready_since(p)
        if since is None or since + min_ready < now:
            continue
        wait = since + min_ready - now
        soonest = wait if soonest is None else min(soonest, wait)
    # Availability is "ready since + minReadySeconds < now" on whole-second stamps: a
    # little past the boundary is certain to count.
    return None if soonest is None else soonest + 0.5


def pod_from_template(rs: Mapping[str, Any], kind: ReplicaKind = REPLICA_SET) -> dict[str, Any]:
    """The pod a ReplicaSet (or RC) creates: its template, a generated name, a controller reference."""
    md = meta(rs)
    template = copy.deepcopy((rs.get("spec") or {}).get("template") or {})
    tmd = template.get("metadata") or {}
    base = f"{md.get('name')}-"[:MAX_GENERATED_BASE]
    pod_md: dict[str, Any] = {"generateName": base, "namespace": md.get("namespace"),
                              "ownerReferences": [
                                  owners.controller_ref(rs, api_version=kind.api_version, kind=kind.kind)]}
    for k in ("labels", "annotations", "finalizers"):
        if tmd.get(k):
            pod_md[k] = tmd[k]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_md,
            "spec": template.get("spec") or {}}


# ---------------------------------------------------------------------------------------
# The controller


class PodWriter:
    """Pod creates and deletes over a few kept-alive `FastConnection`s.

    The controller's hottest requests: through the shared httpx client a create costs
    more CPU on the client side than the API server spends on it (pool scans, header
    models; and bursts beyond the pool's 20 kept-alive connections mean fresh TLS
    handshakes) — in the very process that serves it.  Same signatures as
    `Client.create` / `Client.delete` for what the controller uses."""

    def __init__(self, config: ClientConfig, size: int) -> None:
        self._free = [FastConnection(config, user_agent="fleet-replicaset-controller")
                      for _ in range(size)]
        self._slots = trio.CapacityLimiter(size)

    async def __aenter__(self) -> PodWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self._free:
            await conn.aclose()

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        async with self._slots:
            conn = self._free.pop()
            try:
                status, payload = await conn.request(
                    method, path, data, "application/json" if body is not None else None)
            finally:
                self._free.append(conn)
        try:
            answer = json.loads(payload) if payload else {}
        except ValueError:
            answer = None
        if 200 <= status < 300:
            return answer if isinstance(answer, dict) else {}
        if isinstance(answer, dict) and answer.get("kind") == "Status":
            raise ApiException(answer, status)
        raise ApiException({"kind": "Status", "status": "Failure", "code": status,
                            "message": payload.decode(errors="replace").strip()
                            or f"the server responded with status {status}"}, status)

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        return await self._call("POST", resource_path(api_version, plural, namespace), body)

    async def delete(self, api_version: str, plural: str, name: str,
                     namespace: str | None = None) -> dict[str, Any]:
        return await self._call("DELETE", resource_path(api_version, plural, namespace, name))


class ReplicaSetController(QueueWorker):
    name = "replicaset"
    workers = 4
    kind: ReplicaKind = REPLICA_SET

    def __init__(self) -> None:
        super().__init__()
        self.expectations = Expectations()
        self.api_slots = trio.CapacityLimiter(API_CONCURRENCY)

    # -- wiring ---------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pod_writer: Any = ctx.client
        self.replicasets: SharedInformer = ctx.informers.informer(self.kind.api_version, self.kind.plural)
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.replicasets.add_index(CONTROLLER_INDEX, by_controller_uid)
        self.pods.add_index(CONTROLLER_INDEX, by_controller_uid)
        self.pods.add_index(ORPHAN_INDEX, owners.orphan_namespace)
        self.replicasets.add_handler(self._on_replicaset)
        self.pods.add_handler(self._on_pod)

    async def run(self, ctx: Context) -> None:
        """Pod creates and deletes go through `PodWriter`'s connections of their own."""
        if not isinstance(ctx.client, Client):
            await super().run(ctx)
            return
        async with PodWriter(ctx.client.config, API_CONCURRENCY) as writer:
            self.pod_writer = writer
            await super().run(ctx)

    def _on_replicaset(self, etype: str, old: dict[str, Any] | None,
                       new: dict[str, Any] | None) -> None:
        if etype == "DELETED" and old is not None:
            self.expectations.forget(key_of(old))
            self.enqueue(old)
            return
        self.enqueue(new)

    def _owner_key(self, pod: Mapping[str, Any]) -> str | None:
        """The key of the ReplicaSet controlling `pod`, if it is one we know."""
        ref = owners.controller_of(pod)
        if ref is None or ref.get("kind") != self.kind.kind:
            return None
        key = f"{meta(pod).get('namespace') or ''}/{ref.get('name')}"
        rs = self.replicasets.get(key)
        if rs is None or meta(rs).get("uid") != ref.get("uid"):
            return None
        return key

    def _enqueue_selecting(self, pod: Mapping[str, Any]) -> None:
        """An orphan changed: every ReplicaSet that might adopt it looks."""
        for rs in self.replicasets.list(str(meta(pod).get("namespace") or "")):
            if self.kind.selects(rs, pod):
                self.enqueue(rs)

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED":
            assert old is not None
            key = self._owner_key(old)
            if key is not None:
                self.expectations.deletion_observed(key, str(meta(old).get("uid")))
                self.queue.add(key)
            elif owners.controller_of(old) is None:
                self._enqueue_selecting(old)
            return
        assert new is not None
        key = self._owner_key(new)
        if etype == "ADDED":
            if key is not None:
                if meta(new).get("deletionTimestamp"):
                    self.expectations.deletion_observed(key, str(meta(new).get("uid")))
                else:
                    self.expectations.creation_observed(key)
                self.queue.add(key)
            elif owners.controller_of(new) is None and pod_active(new):
                self._enqueue_selecting(new)
            return
        # MODIFIED
        assert old is not None
        if key is not None and meta(new).get("deletionTimestamp") and \
                not meta(old).get("deletionTimestamp"):
            # Graceful deletion started: a replacement may start now, not when it is gone.
            self.expectations.deletion_observed(key, str(meta(new).get("uid")))
        old_key = self._owner_key(old)
        if old_key is not None and old_key != key:
            self.queue.add(old_key)
        if key is not None:
            self.queue.add(key)
        elif owners.controller_of(new) is None and (
                meta(old).get("labels") != meta(new).get("labels") or owners.controller_of(old) is not None):
            self._enqueue_selecting(new)

    # -- one pass -------------------------------------------------------------------------
    def _candidates(self, rs: Mapping[str, Any]) -> list[dict[str, Any]]:
        ns = str(meta(rs).get("namespace") or "")
        return (self.pods.by_index(CONTROLLER_INDEX, str(meta(rs).get("uid")))
                + self.pods.by_index(ORPHAN_INDEX, ns))

    def _related(self, rs: Mapping[str, Any], own: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pods of every ReplicaSet sharing this one's controller (for ranking)."""
        ref = owners.controller_of(rs)
        if ref is None or not ref.get("uid"):
            return own
        out: list[dict[str, Any]] = []
        for sibling in self.replicasets.by_index(CONTROLLER_INDEX, str(ref["uid"])):
            out.extend(self.pods.by_index(CONTROLLER_INDEX, str(meta(sibling).get("uid"))))
        return out

    async def reconcile(self, key: str) -> float | None:
        rs = self.replicasets.get(key)
        if rs is None:
            self.expectations.forget(key)
            return None
        now = time.time()
        satisfied = self.expectations.satisfied(key)
        p = plan(rs, self._candidates(rs), now=now, expectations_satisfied=satisfied, kind=self.kind)
        if p.delete and owners.controller_of(rs) is not None:
            # Rank against the whole family (all ReplicaSets of the Deployment); only
            # worth gathering when something is to be deleted.
            p.delete = deletion_order(p.owned, self._related(rs, p.owned), now)[:len(p.delete)]
        owned = p.owned
        if p.adopt:
            owned = await self._adopt(rs, p.adopt, owned)
            if len(owned) != len(p.owned):
                # Some orphan was not ours to take after all: the counts the plan acted
                # on are wrong, so decide again rather than create or delete now.
                p.create, p.delete, p.requeue_after = 0, [], 0.05
        for pod in p.release:
            await self._release(rs, pod)
        failure: tuple[str, str] | None = None
        error: Exception | None = None
        if p.create:
            error = await self._create(rs, key, p.create)
            if error is not None:
                failure = ("FailedCreate", str(error))
        elif p.delete:
            error = await self._delete(rs, key, p.delete)
            if error is not None:
                failure = ("FailedDelete", str(error))
        status = compute_status(rs, owned, now, failure) if failure or p.adopt else p.status
        patch = status_patch(rs.get("status"), status)
        if patch is not None:
            try:
                await self.ctx.client.patch(self.kind.api_version, self.kind.plural, meta(rs)["name"],
                                            {"status": patch}, MERGE_PATCH,
                                            meta(rs).get("namespace"), subresource="status")
            except ApiException as e:
                if e.code != 404:
                    raise
        if error is not None:
            raise error
        return p.requeue_after

    async def _adopt(self, rs: Mapping[str, Any], orphans: list[dict[str, Any]],
                     owned: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Take ownership of matching orphans — after checking, with a fresh read, that
        the ReplicaSet is still the one we think and not being deleted (an adoption by
        a ReplicaSet that is going away would hand the pod to the garbage collector)."""
        md = meta(rs)
        try:
            fresh = await self.ctx.client.get_object(self.kind.api_version, self.kind.plural, md["name"],
                                                     md.get("namespace"))
        except ApiException as e:
            if e.code == 404:
                return [p for p in owned if p not in orphans]
            raise
        if meta(fresh).get("uid") != md.get("uid") or meta(fresh).get("deletionTimestamp"):
            return [p for p in owned if p not in orphans]
        kept = [p for p in owned if p not in orphans]
        for pod in orphans:
            pmd = meta(pod)
            ops = owners.adopt_patch(pod, rs, api_version=self.kind.api_version, kind=self.kind.kind)
            try:
                await self.ctx.client.patch("v1", "pods", pmd["name"], ops, JSON_PATCH,
                                            pmd.get("namespace"))
            except ApiException as e:
                if e.code in (404, 409, 422):
                    continue  # gone, changed or taken meanwhile: the next pass sees it
                raise
            kept.append(pod)
        return kept

    async def _release(self, rs: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        pmd = meta(pod)
        try:
            await self.ctx.client.patch("v1", "pods", pmd["name"],
                                        owners.release_patch(pod, rs), JSON_PATCH,
                                        pmd.get("namespace"))
        except ApiException as e:
            if e.code not in (404, 409, 422):
                raise

    async def _create(self, rs: dict[str, Any], key: str, count: int) -> Exception | None:
        """Create `count` pods in slow-start batches; the first error, or None."""
        self.expectations.expect_creations(key, count)
        body = pod_from_template(rs, self.kind)
        ns = meta(rs).get("namespace")
        done = 0
        for batch in slow_start_batches(count):
            errors: list[Exception] = []

            async def one(errors: list[Exception]) -> None:
                try:
                    async with self.api_slots:
                        pod = await self.pod_writer.create("v1", "pods", copy.deepcopy(body), ns)
                except ApiException as e:
                    self.expectations.creation_failed(key)
                    if namespace_terminating(e):
                        return  # every create would fail; the namespace is going away
                    errors.append(e)
                    self.ctx.events.record(rs, "Warning", "FailedCreate", f"Error creating: {e}")
                except Exception as e:  # noqa: BLE001 - a transport error is a failed create too
                    self.expectations.creation_failed(key)
                    errors.append(e)
                else:
                    self.ctx.events.record(rs, "Normal", "SuccessfulCreate",
                                           f"Created pod: {meta(pod).get('name')}")

            async with trio.open_nursery() as n:
                for _ in range(batch):
                    n.start_soon(one, errors)
            done += batch
            if errors:
                # The pods of the batches never tried will not show up either.
                for _ in range(count - done):
                    self.expectations.creation_failed(key)
                return errors[0]
        return None

    async def _delete(self, rs: dict[str, Any], key: str,
                      pods: list[dict[str, Any]]) -> Exception | None:
        self.expectations.expect_deletions(key, [str(meta(p).get("uid")) for p in pods])
        errors: list[Exception] = []

        async def one(pod: dict[str, Any]) -> None:
            pmd = meta(pod)
            try:
                async with self.api_slots:
                    await self.pod_writer.delete("v1", "pods", pmd["name"], pmd.get("namespace"))
            except Exception as e:  # noqa: BLE001 - reported below, the pass retries
                self.expectations.deletion_observed(key, str(pmd.get("uid")))
                if isinstance(e, ApiException) and e.code == 404:
                    return
                errors.append(e)
                self.ctx.events.record(rs, "Warning", "FailedDelete", f"Error deleting: {e}")
            else:
                self.ctx.events.record(rs, "Normal", "SuccessfulDelete",
                                       f"Deleted pod: {pmd.get('name')}")

        async with trio.open_nursery() as n:
            for pod in pods:
                n.start_soon(one, pod)
        return errors[0] if errors else None


class ReplicationManager(ReplicaSetController):
    """kube-controller-manager's `replicationcontroller` controller: the same loop over
    core/v1 ReplicationControllers (their pods, status and ReplicaFailure condition)."""

    name = "replicationcontroller"
    kind = REPLICATION_CONTROLLER
