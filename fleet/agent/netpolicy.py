"""NetworkPolicy on the node: each local pod's rules, programmed inside its network namespace.

The thin I/O half around the pure engine (`fleet.network.policy`: which rules a pod
gets) and renderer (`fleet.network.policy_nft`: the `nft -f` script that replaces
the pod's `inet fleet-policy` table atomically).  This module decides only *when*
and *where*:

* **Informers**: NetworkPolicies, Pods (every namespace: peers are selected by
  label wherever they run), Namespaces, and the agent's Services and
  EndpointSlices (shared with the service-link variables and the service proxy:
  a ClusterIP in an egress rule's reach is the Service whose endpoints it names).
  A change that can alter someone's rules — any policy, a pod's labels / IPs /
  phase / named ports, a namespace's labels, any Service or slice — marks the
  state dirty; a pod's status heartbeat does not.
* **One loop** coalesces a burst (`min_sync_interval`, 50 ms), snapshots the caches,
  computes every *local* pod's script (pods bound to this node, not hostNetwork,
  whose netns exists — `local_targets`) in a worker thread, and applies only the
  scripts that differ from what it last applied (`plan_applies`), `parallel` at a
  time (each `nft -f` runs under `nsenter --net=<pod netns>`).  Every
  `resync_interval` it checks each programmed pod still has its table (someone may
  `nft flush ruleset` inside a pod) and re-applies the ones that lost it.
* **New pods** (`prepare_netns`, called by the pod sandbox right after network
  set-up, before any container starts): in strict mode it installs `deny_all()`
  first, unless the netns holds our table already (a pod adopted after an agent
  restart keeps its rules) — if even that fails the sandbox set-up fails and is retried, so no
  container ever runs unfenced — then wakes the loop and waits (bounded by
  `first_program_timeout`) for the pod's real rules, so containers normally start
  with them in force.
* **Failures** (render or `nft` refused): a Warning Event `NetworkPolicyFailed` on the
  pod saying why (the agent's EventRecorder deduplicates repeats), the
  `fleet_network_policy_failures_total` counter, and a retry with per-pod back-off.
  Non-strict: the pod's previous rules stay in force (the replacement is one
  transaction), or none — default allow — if it never had any.  Strict
  (`network_policy_strict`): the pod is fenced with `deny_all()` until its rules
  can be programmed (fail closed).
* **Drivers without a pod netns** (`joins_pod_netns` False: the process driver runs
  containers in the node's namespace) cannot be enforced at all: a Warning Event,
  once per pod, when a policy selects it — in strict mode too; such pods are
  unprotected, they cannot be fenced.

Nothing is torn down when the agent stops: the tables live in the pods' namespaces
and die with them (`fleet killall` and pod teardown delete the namespaces), and a
restarted agent re-applies every local pod once from fresh caches.

Metrics (the agent's registry): `fleet_network_policy_sync_seconds` (histogram, one
pass), `fleet_network_policy_failures_total{stage}` (render / apply / fence),
`fleet_network_policy_programmed_pods` (gauge: pods whose rules are in force).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import Counter, Gauge, Histogram

from fleet._core.supervise import REGISTRY
from fleet.network import nft
from fleet.network.netns import DEFAULT_NETNS_DIR, is_netns, pod_netns_path
from fleet.network.policy import PolicyIndex, PolicyView
from fleet.network.policy_nft import FAMILY, TABLE, deny_all, render

log = logging.getLogger(__name__)

REASON_FAILED = "NetworkPolicyFailed"

SYNC_SECONDS = Histogram(
    "fleet_network_policy_sync_seconds",
    "Time of one NetworkPolicy pass: compute every local pod's rules and apply the changed ones.",
    registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
FAILURES = Counter("fleet_network_policy_failures",
                   "Pods whose NetworkPolicy rules could not be computed (render), loaded "
                   "(apply) or, in strict mode, fenced with deny-all (fence).",
                   ["stage"], registry=REGISTRY)
PROGRAMMED = Gauge("fleet_network_policy_programmed_pods",
                   "Local pods whose NetworkPolicy rules are in force in their netns.",
                   registry=REGISTRY)

Applier = Callable[[str, str], Awaitable[None]]


# ---------------------------------------------------------------------------------------
# Pure decisions


def _md(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    st = obj.get("status")
    return st if isinstance(st, Mapping) else {}


def pod_policy_facts(pod: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What of a pod can change anyone's rules: identity, labels, addresses, phase,
    node, hostNetwork and its containers' (named) ports.  A status heartbeat (a
    condition's time, a restart count) leaves this unchanged."""
    if not pod:
        return ()
    md, spec, st = _md(pod), _spec(pod), _status(pod)
    ports = tuple(sorted(
        (str(p.get("name") or ""), str(p.get("containerPort")), str(p.get("protocol") or "TCP"))
        for key in ("containers", "initContainers")
        for c in (spec.get(key) or []) if isinstance(c, Mapping)
        for p in (c.get("ports") or []) if isinstance(p, Mapping)))
    ips = tuple(str(i.get("ip")) for i in (st.get("podIPs") or []) if isinstance(i, Mapping))
    return (md.get("namespace"), md.get("name"), md.get("uid"),
            tuple(sorted((md.get("labels") or {}).items())), ips, st.get("podIP"),
            st.get("phase"), spec.get("nodeName"), bool(spec.get("hostNetwork")), ports)


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the enforcer keeps of a pod (the informer's transform): every pod of the
    cluster is a possible peer, so the agent caches them all — only the fields policy
    evaluation, the change test and Events read (identity, labels, node, hostNetwork,
    containers' ports, phase and IPs), not whole pod specs."""
    md, spec, st = _md(pod), _spec(pod), _status(pod)

    def containers(key: str) -> list[dict[str, Any]]:
        return [{k: c[k] for k in ("name", "ports", "restartPolicy") if k in c}
                for c in (spec.get(key) or []) if isinstance(c, Mapping)]

    return {
        "apiVersion": pod.get("apiVersion", "v1"), "kind": pod.get("kind", "Pod"),
        "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels",
                                        "creationTimestamp", "deletionTimestamp") if k in md},
        "spec": {**{k: spec[k] for k in ("nodeName", "hostNetwork") if k in spec},
                 "containers": containers("containers"),
                 "initContainers": containers("initContainers")},
        "status": {k: st[k] for k in ("phase", "podIP", "podIPs") if k in st},
    }


def pod_change_matters(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    return pod_policy_facts(old) != pod_policy_facts(new)


def namespace_change_matters(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Only a namespace's name and labels are seen by namespaceSelectors."""
    def facts(ns: Mapping[str, Any] | None) -> tuple[Any, ...]:
        md = _md(ns or {})
        return (md.get("name"), tuple(sorted((md.get("labels") or {}).items()))) if ns else ()
    return facts(old) != facts(new)


@dataclass(frozen=True)
class Target:
    """A local pod the enforcer programs: the pod object and its namespace file."""

    uid: str
    pod: Mapping[str, Any] = field(compare=False, repr=False)
    netns: str

    @property
    def ref(self) -> str:
        md = _md(self.pod)
        return f"{md.get('namespace') or 'default'}/{md.get('name')}"


def local_targets(pods: Iterable[Mapping[str, Any]], node_name: str, netns_dir: str | None,
                  netns_exists: Callable[[str], bool] = is_netns) -> list[Target]:
    """Pods on `node_name`, not hostNetwork, not finished, whose pod netns exists (one
    still being set up or already torn down has nothing to program)."""
    out = []
    for pod in pods:
        spec, md = _spec(pod), _md(pod)
        uid = str(md.get("uid") or "")
        if (not uid or spec.get("nodeName") != node_name or spec.get("hostNetwork")
                or _status(pod).get("phase") in ("Succeeded", "Failed")):
            continue
        try:
            path = pod_netns_path(uid, netns_dir or DEFAULT_NETNS_DIR)
        except ValueError:
            continue
        if netns_exists(path):
            out.append(Target(uid, pod, path))
    return out


@dataclass(frozen=True)
class Desired:
    """One local pod's wanted table (or why it cannot be had)."""

    script: str | None  # None: rendering failed, see `error`
    isolated: bool = False  # some policy selects the pod, for either direction
    policies: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    error: str = ""


def compute_desired(targets: Sequence[Target], *, policies: Sequence[Mapping[str, Any]],
                    pods: Sequence[Mapping[str, Any]], namespaces: Sequence[Mapping[str, Any]],
                    services: Sequence[Mapping[str, Any]], slices: Sequence[Mapping[str, Any]],
                    always_allow: Sequence[str]) -> dict[str, Desired]:
    """Pure: each target's rendered script, from one snapshot of the caches.  A pod the
    engine or renderer cannot handle gets an error, never stops the others."""
    try:
        index = PolicyIndex(PolicyView(policies, pods, namespaces, services, slices))
    except Exception as e:  # the engine reads forgivingly; should it still fail, say so per pod
        return {t.uid: Desired(None, error=f"{type(e).__name__}: {e}") for t in targets}
    out: dict[str, Desired] = {}
    for t in targets:
        try:
            rules = index.rules_for(t.pod)
            script = render(rules, always_allow=always_allow)
        except Exception as e:  # one pod's bad input must not stop the node's policy
            out[t.uid] = Desired(None, error=f"{type(e).__name__}: {e}")
            continue
        out[t.uid] = Desired(script, bool(rules.ingress_isolated or rules.egress_isolated),
                             tuple(rules.policies), tuple(rules.problems))
    return out


def plan_applies(desired: Mapping[str, str | None], applied: Mapping[str, str],
                 retry_at: Mapping[str, float], now: float) -> tuple[list[str], float | None]:
    """Pure: the pods to (re)program now — their script differs from what was last
    applied, or could not be rendered — leaving out those backing off; and when the
    earliest back-off ends (None: nobody waits)."""
    due, wake = [], None
    for uid, script in sorted(desired.items()):
        if script is not None and applied.get(uid) == script:
            continue
        at = retry_at.get(uid)
        if at is not None and at > now:
            wake = at if wake is None else min(wake, at)
            continue
        due.append(uid)
    return due, wake


def failure_message(why: str, *, strict: bool, fenced: bool, had_rules: bool,
                    fence_error: str = "") -> str:
    """The NetworkPolicyFailed Event's message: why, and what the pod's traffic is now."""
    head = f"cannot program the pod's network policy rules: {why}"
    if strict:
        if fenced:
            return head + "; strict mode: the pod gets no traffic until they can be programmed"
        return head + f"; strict mode, but deny-all could not be installed either: {fence_error}"
    if had_rules:
        return head + "; its previous rules stay in force"
    return head + "; no rules in force: its traffic is not filtered"


UNENFORCEABLE = ("NetworkPolicy {policies} selects this pod, but its runtime driver ({driver}) runs "
                 "containers in the node's network namespace, where policy cannot be enforced{strict}")


def unenforceable_message(policies: Sequence[str], driver: str, strict: bool) -> str:
    return UNENFORCEABLE.format(policies=", ".join(policies) or "?", driver=driver or "?",
                                strict="; strict mode cannot fence it: the pod is unprotected"
                                if strict else "")


# ---------------------------------------------------------------------------------------
# The loop


@dataclass
class EnforcerConfig:
    node_name: str
    netns_dir: str | None = None
    strict: bool = False
    #: Sources always admitted (the pod's node: kubelet-style probes come from it).
    always_allow: tuple[str, ...] = ()
    #: Changes arriving within this many seconds are computed together.
    min_sync_interval: float = 0.05
    #: How often to check each programmed pod still has its table.
    resync_interval: float = 30.0
    #: `nft` processes at once.
    parallel: int = 4
    retry_backoff: float = 1.0
    max_backoff: float = 60.0
    #: How long a new pod's set-up waits for its first rules before its containers start.
    first_program_timeout: float = 10.0
    #: The runtime driver's name, and whether its containers join the pod netns.
    driver: str = ""
    enforceable: bool = True


@dataclass
class SyncReport:
    """What one pass did (tests and logs)."""

    applied: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)
    skipped: int = 0


class PolicyEnforcer:
    """Keeps every local pod's `inet fleet-policy` table equal to its rendered rules."""

    def __init__(self, cfg: EnforcerConfig, *, apply: Applier | None = None,
                 table_exists: Callable[[str], Awaitable[bool]] | None = None,
                 events: Any = None, netns_exists: Callable[[str], bool] = is_netns,
                 compute: Callable[..., dict[str, Desired]] = compute_desired,
                 plan_in_thread: bool = True) -> None:
        self.cfg = cfg
        self._apply = apply or (lambda script, netns: nft.apply(script, netns=netns))
        self._table_exists = table_exists or _table_exists
        self.events = events
        self.netns_exists = netns_exists
        self.compute = compute
        # Tests under a MockClock compute on the event loop (a thread's time is not mocked).
        self.plan_in_thread = plan_in_thread
        #: uid -> script last applied successfully (a rendered table or deny-all).
        self.applied: dict[str, str] = {}
        #: uid -> (time of the next attempt, back-off after it, the script that failed)
        #: for failing pods.  Different wanted rules are tried at once, not after it.
        self.retry: dict[str, tuple[float, float, str | None]] = {}
        self.warned: set[str] = set()  # unenforceable pods told so
        self._waiters: dict[str, trio.Event] = {}
        self._dirty = trio.Event()
        self._limiter = trio.CapacityLimiter(max(1, cfg.parallel))
        self._lock = trio.Lock()
        self.synced = trio.Event()  # informers listed, first pass done
        self.passes = 0
        # Caches (informers in `run`; tests set these lists directly).
        self.sources: dict[str, Callable[[], Iterable[Mapping[str, Any]]]] = {
            k: tuple for k in ("policies", "pods", "namespaces", "services", "slices")}

    # -- wiring --------------------------------------------------------------------------
    def wake(self) -> None:
        self._dirty.set()

    def _deny_all(self) -> str:
        return deny_all(always_allow=self.cfg.always_allow)

    async def prepare_netns(self, pod: Mapping[str, Any], netns: str) -> None:
        """The pod sandbox's hook, after network set-up and before any container: fence
        the pod in strict mode (raises if even that fails: the set-up is retried),
        then have the loop program it and wait for that, within bounds."""
        if not self.cfg.enforceable:
            return
        uid = str(_md(pod).get("uid") or "")
        if self.cfg.strict:
            deny = self._deny_all()
            # Not while a pass runs: it may be loading this pod's rules right now (its
            # netns exists), and deny-all landing after them would stay unnoticed.
            async with self._lock:
                # A netns that holds our table already is an adopted pod's (an agent
                # restart): its rules stay in force until the fresh pass replaces them —
                # fencing it would cut its established connections for nothing.
                try:
                    programmed = await self._table_exists(netns)
                except (nft.NftError, OSError):
                    programmed = False
                if not programmed:
                    await self._apply(deny, netns)
                    self.applied[uid] = deny
        self.wake()
        if not self.synced.is_set():
            # Not listening yet (agent start-up, or the API lacks NetworkPolicy): holding
            # every pod's start for it would add nothing; it programs them once it runs.
            return
        done = self._waiters.setdefault(uid, trio.Event())
        try:
            with trio.move_on_after(self.cfg.first_program_timeout):
                await done.wait()
        finally:
            if self._waiters.get(uid) is done:
                del self._waiters[uid]

    # -- one pass ------------------------------------------------------------------------
    def _compute(self, src: Mapping[str, list[Mapping[str, Any]]]
                 ) -> tuple[list[Target], dict[str, Desired]]:
        targets = local_targets(src["pods"], self.cfg.node_name, self.cfg.netns_dir,
                                self.netns_exists)
        desired = self.compute(targets, policies=src["policies"], pods=src["pods"],
                               namespaces=src["namespaces"], services=src["services"],
                               slices=src["slices"], always_allow=self.cfg.always_allow)
        return targets, desired

    async def sync(self) -> tuple[SyncReport, float | None]:
        """One pass; returns what it did and when the earliest back-off ends."""
        async with self._lock:
            t0 = time.perf_counter()
            # A snapshot taken on the event loop (the informers mutate their caches here).
            src = {k: list(fn()) for k, fn in self.sources.items()}
            if self.plan_in_thread:
                targets, desired = await trio.to_thread.run_sync(self._compute, src)
            else:
                targets, desired = self._compute(src)
            by_uid = {t.uid: t for t in targets}
            for uid in set(self.applied) | set(self.retry) | self.warned:
                if uid not in by_uid:  # deleted, or its netns gone: the table went with it
                    self._forget(uid)
            report = SyncReport()
            wake = None
            if not self.cfg.enforceable:
                await self._warn_unenforceable(by_uid, desired)
                report.skipped = len(by_uid)
            else:
                backing_off = {u: at for u, (at, _, failed) in self.retry.items()
                               if u in desired and desired[u].script == failed}
                due, _ = plan_applies({u: d.script for u, d in desired.items()}, self.applied,
                                      backing_off, trio.current_time())
                async with trio.open_nursery() as n:
                    for uid in due:
                        n.start_soon(self._program, by_uid[uid], desired[uid], report)
                report.skipped = len(by_uid) - len(due)
                # Including the pods that failed just now.
                wake = min((at for at, _, _ in self.retry.values()), default=None)
                for uid, d in desired.items():
                    if uid not in self.retry and d.script is not None \
                            and self.applied.get(uid) == d.script:
                        self._done(uid)
            PROGRAMMED.set(sum(1 for u, d in desired.items()
                               if d.script is not None and self.applied.get(u) == d.script))
            SYNC_SECONDS.observe(time.perf_counter() - t0)
            self.passes += 1
            if report.applied or report.failed:
                log.info("network policy: programmed %d pod(s), %d failed (%d fenced), "
                         "%d unchanged, in %.3fs", len(report.applied), len(report.failed),
                         len(report.fenced), report.skipped, time.perf_counter() - t0)
            return report, wake

    async def _program(self, t: Target, d: Desired, report: SyncReport) -> None:
        if d.script is not None:
            try:
                async with self._limiter:
                    await self._apply(d.script, t.netns)
            except (nft.NftError, OSError) as e:
                if not self.netns_exists(t.netns):
                    self._forget(t.uid)  # the pod went meanwhile: nothing to program
                    return
                FAILURES.labels("apply").inc()
                why = str(e).strip() or type(e).__name__
            else:
                self.applied[t.uid] = d.script
                if t.uid in self.retry:
                    log.info("network policy: pod %s programmed again", t.ref)
                self.retry.pop(t.uid, None)
                report.applied.append(t.uid)
                self._done(t.uid)
                return
        else:
            FAILURES.labels("render").inc()
            why = d.error
        await self._failed(t, why, report, d.script)

    async def _failed(self, t: Target, why: str, report: SyncReport, script: str | None) -> None:
        report.failed.append(t.uid)
        _, backoff, _ = self.retry.get(t.uid, (0.0, self.cfg.retry_backoff, None))
        self.retry[t.uid] = (trio.current_time() + backoff, min(backoff * 2, self.cfg.max_backoff),
                             script)
        had_rules = t.uid in self.applied
        fenced, fence_error = False, ""
        if self.cfg.strict:
            deny = self._deny_all()
            if self.applied.get(t.uid) == deny:
                fenced = True
            else:
                try:
                    async with self._limiter:
                        await self._apply(deny, t.netns)
                    self.applied[t.uid] = deny
                    fenced = True
                except (nft.NftError, OSError) as e:
                    FAILURES.labels("fence").inc()
                    # What the kernel holds is unknown now: the next try replaces it whole.
                    self.applied.pop(t.uid, None)
                    fence_error = str(e).strip() or type(e).__name__
            if fenced:
                report.fenced.append(t.uid)
        message = failure_message(why, strict=self.cfg.strict, fenced=fenced,
                                  had_rules=had_rules, fence_error=fence_error)
        log.warning("network policy: pod %s: %s (retry in %.1fs)", t.ref, message,
                    self.retry[t.uid][0] - trio.current_time())
        await self._event(t.pod, message)
        self._done(t.uid)  # a waiting set-up goes on: fenced (strict) or as it is

    async def _warn_unenforceable(self, by_uid: Mapping[str, Target],
                                  desired: Mapping[str, Desired]) -> None:
        for uid, d in desired.items():
            if d.isolated and uid not in self.warned:
                self.warned.add(uid)
                message = unenforceable_message(d.policies, self.cfg.driver, self.cfg.strict)
                log.warning("network policy: pod %s: %s", by_uid[uid].ref, message)
                await self._event(by_uid[uid].pod, message)

    async def _event(self, pod: Mapping[str, Any], message: str) -> None:
        if self.events is not None:
            await self.events.record(dict(pod), "Warning", REASON_FAILED, message)

    def _done(self, uid: str) -> None:
        ev = self._waiters.pop(uid, None)
        if ev is not None:
            ev.set()

    def _forget(self, uid: str) -> None:
        self.applied.pop(uid, None)
        self.retry.pop(uid, None)
        self.warned.discard(uid)

    async def check_tables(self, targets: Iterable[Target] | None = None) -> list[str]:
        """Pods whose table vanished (they are re-applied on the next pass)."""
        netns = {t.uid: t.netns for t in targets} if targets is not None else {
            uid: pod_netns_path(uid, self.cfg.netns_dir or DEFAULT_NETNS_DIR)
            for uid in self.applied}
        lost: list[str] = []

        async def check(uid: str, path: str) -> None:
            try:
                async with self._limiter:
                    present = await self._table_exists(path)
            except (nft.NftError, OSError):
                return  # the netns went, or nft is unusable: the next pass says so
            if not present:
                lost.append(uid)

        async with trio.open_nursery() as n:
            for uid, path in netns.items():
                if uid in self.applied:
                    n.start_soon(check, uid, path)
        for uid in lost:
            self.applied.pop(uid, None)
        return sorted(lost)

    async def loop(self) -> None:
        """Coalesce changes, sync, retry failures when due, check tables periodically."""
        next_check = trio.current_time() + self.cfg.resync_interval
        while True:
            self._dirty = trio.Event()
            _, wake = await self.sync()
            if not self.synced.is_set():
                self.synced.set()
            until = min(next_check, wake) if wake is not None else next_check
            with trio.move_on_at(until):
                await self._dirty.wait()
            if trio.current_time() >= next_check:
                next_check = trio.current_time() + self.cfg.resync_interval
                lost = await self.check_tables()
                if lost:
                    log.warning("network policy: %d pod(s) lost their table; re-applying", len(lost))
            # Let a burst of changes (a rollout, a relist, a label sweep) land in one pass.
            await trio.sleep(self.cfg.min_sync_interval)

    async def run(self, client: Any, *, services: Any = None, slices: Any = None,
                  task_status: trio.TaskStatus[PolicyEnforcer] = trio.TASK_STATUS_IGNORED) -> None:
        """The agent's task: informers (sharing the caller's Services / EndpointSlices
        informers if given), then `loop`; `started(self)` once they have listed."""
        from fleet.client.informer import Informer

        def changed(etype: str, old: Any, new: Any) -> None:
            self.wake()

        def pod_changed(etype: str, old: Any, new: Any) -> None:
            if etype != "MODIFIED" or pod_change_matters(old, new):
                self.wake()

        def ns_changed(etype: str, old: Any, new: Any) -> None:
            if etype != "MODIFIED" or namespace_change_matters(old, new):
                self.wake()

        comp = "network-policy"
        informers: dict[str, Any] = {
            "policies": Informer(client, "networking.k8s.io/v1", "networkpolicies", component=comp),
            "pods": Informer(client, "v1", "pods", component=comp, transform=slim_pod),
            "namespaces": Informer(client, "v1", "namespaces", component=comp),
            "services": services if services is not None else Informer(
                client, "v1", "services", component=comp),
            "slices": slices if slices is not None else Informer(
                client, "discovery.k8s.io/v1", "endpointslices", component=comp)}
        shared = [inf for inf in (services, slices) if inf is not None]
        own = [inf for inf in informers.values() if inf not in shared]
        handlers = {"policies": changed, "pods": pod_changed, "namespaces": ns_changed,
                    "services": changed, "slices": changed}
        for key, inf in informers.items():
            inf.add_handler(handlers[key])
            self.sources[key] = inf.list
        try:
            async with trio.open_nursery() as n:
                for inf in own:
                    await n.start(inf.run)
                for inf in shared:
                    await inf.wait_synced()
                n.start_soon(self.loop)
                await self.synced.wait()
                task_status.started(self)
        finally:
            for key, inf in informers.items():
                if inf in shared:
                    inf.remove_handler(handlers[key])


async def _table_exists(netns: str) -> bool:
    return await nft.table_exists(FAMILY, TABLE, netns=netns)


__all__ = [
    "FAILURES",
    "PROGRAMMED",
    "REASON_FAILED",
    "SYNC_SECONDS",
    "Desired",
    "EnforcerConfig",
    "PolicyEnforcer",
    "SyncReport",
    "Target",
    "compute_desired",
    "failure_message",
    "local_targets",
    "namespace_change_matters",
    "plan_applies",
    "pod_change_matters",
    "pod_policy_facts",
    "unenforceable_message",
]
