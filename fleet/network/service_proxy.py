"""The node's service proxy: Services + EndpointSlices (+ its Node) → the kernel's rules.

The thin I/O half around `fleet.network.proxy_rules` (what the table should hold)
and `fleet.network.proxy_diff` (how to get there in one transaction):

* `ServiceRules` owns one table in one network namespace and remembers what it last
  applied.  `await rules.sync(services, slices)` renders, diffs and runs the
  transaction with `nft -f` — the whole table replaced atomically the first time (or
  after a failure, or when the table vanished), only the differences after that.
  Tests and the benchmark drive it directly, with hand-written objects.
* `run_service_proxy(client, cfg)` is the agent's task: three informers (Services,
  EndpointSlices, this Node for its addresses); every event marks the rules dirty, and
  one loop coalesces changes for `min_sync_interval` before each sync (kube-proxy's
  bounded-frequency runner, in its simplest form).  It syncs only once every informer
  has listed, so a restart never applies a table rendered from empty caches: the old
  rules stay live until the fresh ones replace them in one transaction.  Nothing is
  torn down on stop — running pods keep their Services through an agent restart;
  `fleet killall` / a node reset removes the table (`fleet.agent.inventory`).
* After a successful sync that took serving endpoints away from a UDP port (or gave a
  rejecting one its first), `ServiceRules` deletes the conntrack entries that would
  keep clients on the old path (`fleet.network.proxy_conntrack`; its first sync, with
  nothing to compare to, reconciles every UDP port instead), in a worker thread in the
  table's namespace; a failure is logged and counted, the sync stands.

Rendering a thousand Services takes a noticeable fraction of a second, so it runs in
a worker thread on a snapshot of the caches; the event loop keeps serving meanwhile.
Metrics (process-wide registry, served on the agent's /metrics):
`fleet_service_proxy_sync_seconds` (histogram), `fleet_service_proxy_rules` (rules +
map elements in the table), `fleet_service_proxy_sync_failures_total`,
`fleet_service_proxy_conntrack_deleted_total`, `fleet_service_proxy_conntrack_failures_total`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from prometheus_client import Counter, Gauge, Histogram

from fleet._core.supervise import REGISTRY
from fleet.network import nft
from fleet.network.proxy_conntrack import FlowFilter, UdpPort, delete_flows, stale_flows
from fleet.network.proxy_diff import Op, diff, full, hold_chain_deletes, needs_full, script
from fleet.network.proxy_rules import DEFAULT_TABLE, ProxyOptions, Renderer, Table

log = logging.getLogger(__name__)

#: Seconds a chain that went stays (flushed) before it is deleted: see
#: `fleet.network.proxy_diff.hold_chain_deletes` (kube-proxy waits one second too).
STALE_CHAIN_GRACE = 1.0

SYNC_SECONDS = Histogram(
    "fleet_service_proxy_sync_seconds",
    "Time to render, diff and apply the service rules (one nft transaction).",
    ["kind"], registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
RULES = Gauge("fleet_service_proxy_rules",
              "Rules and map/set elements in the service proxy's nftables table.",
              registry=REGISTRY)
SYNC_FAILURES = Counter("fleet_service_proxy_sync_failures",
                        "Service rule transactions nft refused.", registry=REGISTRY)
CONNTRACK_DELETED = Counter("fleet_service_proxy_conntrack_deleted",
                            "Stale UDP conntrack entries deleted after syncs.", registry=REGISTRY)
CONNTRACK_FAILURES = Counter("fleet_service_proxy_conntrack_failures",
                             "Conntrack clean-ups that failed (logged; the sync stands).",
                             registry=REGISTRY)


@dataclass
class SyncResult:
    """What one sync did: `kind` "full", "incremental" or "noop", the ops and timings."""

    kind: str
    ops: list[Op]
    script: str
    render_seconds: float
    apply_seconds: float
    #: Stale UDP flows this sync called for, and how many entries went (None: failed).
    conntrack: list[FlowFilter] = field(default_factory=list)
    conntrack_deleted: int | None = 0


class ServiceRules:
    """One proxy table in one network namespace, kept equal to the latest rendering."""

    def __init__(self, opts: ProxyOptions, *, netns: str | None = None,
                 stale_chain_grace: float = STALE_CHAIN_GRACE,
                 apply: Callable[[str, str | None], Awaitable[None]] | None = None,
                 plan_in_thread: bool = True,
                 conntrack: Callable[[list[FlowFilter], str | None], int] | None | bool = True) -> None:
        self.opts = opts
        self.renderer = Renderer(opts)
        self.netns = netns
        self.applied: Table | None = None  # None: next sync replaces the table whole
        #: Per-service chains flushed but not yet deleted (`hold_chain_deletes`).
        self.stale: dict[str, float] = {}
        self.stale_chain_grace = stale_chain_grace
        self._apply = apply or (lambda text, netns: nft.apply(text, netns=netns))
        # Tests under a MockClock plan on the event loop (a thread's time is not mocked).
        self.plan_in_thread = plan_in_thread
        self._lock = trio.Lock()
        #: Deletes stale UDP flows in a worker thread after a sync (None: never).  By
        #: default the kernel's, unless `apply` is a test's recorder (then none).
        if conntrack is True:
            conntrack = delete_flows if apply is None else None
        self._conntrack = conntrack or None
        #: The UDP ports the kernel's rules were last brought to (None: not known yet).
        self.udp_applied: dict[tuple[str, str, str, str], UdpPort] | None = None

    def next_cleanup(self) -> float | None:
        """Seconds until held chains are due for deletion (None: nothing held)."""
        if not self.stale:
            return None
        return max(0.0, min(self.stale.values()) + self.stale_chain_grace - trio.current_time())

    @property
    def table(self) -> str:
        return self.opts.table

    def plan(self, services: Iterable[Mapping[str, Any]],
             slices: Iterable[Mapping[str, Any]]) -> tuple[Table, list[Op], bool]:
        """Pure: the desired table and the operations from what was applied to it."""
        new = self.renderer.render(services, slices)
        if needs_full(self.applied, new):
            return new, full(new), True
        assert self.applied is not None
        return new, diff(self.applied, new), False

    async def sync(self, services: Iterable[Mapping[str, Any]],
                   slices: Iterable[Mapping[str, Any]], *,
                   node_ips: Iterable[str] | None = None) -> SyncResult:
        """Bring the kernel's table to what `services` and `slices` call for."""
        async with self._lock:
            if node_ips is not None and tuple(node_ips) != self.opts.node_ips:
                self.opts = replace(self.opts, node_ips=tuple(node_ips))
                self.renderer = Renderer(self.opts)
            services, slices = list(services), list(slices)
            t0 = time.perf_counter()
            if self.plan_in_thread:
                new, ops, is_full = await trio.to_thread.run_sync(self.plan, services, slices)
            else:
                new, ops, is_full = self.plan(services, slices)
            stale: dict[str, float] = {}
            applied = new
            if not is_full:
                ops, applied, stale = hold_chain_deletes(ops, new, self.stale, trio.current_time(),
                                                         self.stale_chain_grace)
            text = script(new, ops) if ops else ""
            t1 = time.perf_counter()
            kind = "full" if is_full else "incremental" if ops else "noop"
            if ops:
                try:
                    await self._apply(text, self.netns)
                except nft.NftError:
                    SYNC_FAILURES.inc()
                    self.applied, self.stale = None, {}  # we no longer know what the kernel holds
                    raise
            t2 = time.perf_counter()
            self.applied, self.stale = applied, stale
            SYNC_SECONDS.labels(kind).observe(t2 - t0)
            RULES.set(new.rule_count())
            udp = dict(self.renderer.udp_ports)
            flows = stale_flows(self.udp_applied, udp)
            self.udp_applied = udp
            deleted = await self.clear_conntrack(flows) if flows else 0
            return SyncResult(kind, ops, text, t1 - t0, t2 - t1, flows, deleted)

    async def clear_conntrack(self, flows: list[FlowFilter]) -> int | None:
        """Delete the UDP conntrack entries `flows` match in our namespace; a failure is
        logged and counted, never raised (the rules are in place; entries time out)."""
        if self._conntrack is None:
            return 0
        try:
            n = await trio.to_thread.run_sync(self._conntrack, flows, self.netns)
        except Exception as e:  # netlink, a vanished namespace, a missing module...
            CONNTRACK_FAILURES.inc()
            log.warning("service proxy: conntrack clean-up of %d filter(s) failed: %r", len(flows), e)
            return None
        CONNTRACK_DELETED.inc(n)
        if n:
            log.info("service proxy: deleted %d stale UDP conntrack entr%s (%s)", n,
                     "y" if n == 1 else "ies", "; ".join(map(str, flows[:5])))
        return n

    async def check_present(self) -> bool:
        """False (and the next sync is a full one) if someone deleted our table."""
        present = await nft.table_exists("ip", self.table, netns=self.netns)
        if not present:
            self.applied, self.stale = None, {}
        return present

    async def uninstall(self) -> bool:
        """Delete the table (node reset, tests); returns whether it existed."""
        self.applied, self.stale = None, {}
        return await nft.delete_table("ip", self.table, netns=self.netns)


def node_addresses(node: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The Node's IPv4 InternalIP/ExternalIP addresses, in status order."""
    status = (node or {}).get("status")
    addrs = status.get("addresses") if isinstance(status, Mapping) else None
    out: list[str] = []
    for a in addrs if isinstance(addrs, list) else []:
        if isinstance(a, Mapping) and a.get("type") in ("InternalIP", "ExternalIP"):
            ip = str(a.get("address") or "")
            if ip.count(".") == 3 and ip not in out:
                out.append(ip)
    return tuple(out)


@dataclass
class ServiceProxyConfig:
    """The agent's service proxy settings."""

    node_name: str
    cluster_cidr: str | None = "10.42.0.0/16"
    service_cidr: str | None = "10.43.0.0/16"
    table: str = DEFAULT_TABLE
    netns: str | None = None
    #: Changes arriving within this many seconds go into one transaction.
    min_sync_interval: float = 0.05
    #: How often to check the table is still there (someone may `nft flush ruleset`).
    check_interval: float = 30.0
    retry_backoff: float = 1.0
    nodeport_addresses: str = "all"

    def options(self, node_ips: tuple[str, ...] = ()) -> ProxyOptions:
        return ProxyOptions(node_name=self.node_name, node_ips=node_ips,
                            cluster_cidr=self.cluster_cidr, service_cidr=self.service_cidr,
                            table=self.table, nodeport_addresses=self.nodeport_addresses)


async def run_service_proxy(client: Any, cfg: ServiceProxyConfig, *,
                            rules: ServiceRules | None = None, services: Any = None,
                            slices: Any = None,
                            task_status: trio.TaskStatus[ServiceRules] = trio.TASK_STATUS_IGNORED) -> None:
    """The agent's service proxy task; `started(rules)` after the first sync.
    (`rules`: tests pass one whose transactions they record.  `services`, `slices`: a
    Service / EndpointSlice informer the caller already runs — the agent shares its
    Services with the pod workers' service-link variables and its EndpointSlices with
    the NetworkPolicy enforcer — else one of its own.)"""
    from fleet.client.informer import Informer

    rules = rules or ServiceRules(cfg.options(), netns=cfg.netns)
    own_services = services is None
    if services is None:
        services = Informer(client, "v1", "services", component="service-proxy")
    own_slices = slices is None
    if slices is None:
        slices = Informer(client, "discovery.k8s.io/v1", "endpointslices", component="service-proxy")
    nodes = Informer(client, "v1", "nodes", field_selector=f"metadata.name={cfg.node_name}",
                     component="service-proxy")
    dirty = trio.Event()

    def changed(etype: str, old: Any, new: Any) -> None:
        dirty.set()

    def node_changed(etype: str, old: Any, new: Any) -> None:
        # The Node's status is rewritten every heartbeat; only its addresses matter here.
        if node_addresses(old) != node_addresses(new):
            dirty.set()

    services.add_handler(changed)
    slices.add_handler(changed)
    nodes.add_handler(node_changed)

    async def sync_now() -> None:
        node = nodes.get(f"/{cfg.node_name}")
        res = await rules.sync(list(services.items.values()), list(slices.items.values()),
                               node_ips=node_addresses(node))
        if res.kind != "noop":
            log.info("service proxy: %s sync of table ip %s, %d op(s) in %.3fs (render %.3fs)",
                     res.kind, rules.table, len(res.ops), res.render_seconds + res.apply_seconds,
                     res.render_seconds)

    async def checker() -> None:
        while True:
            await trio.sleep(cfg.check_interval)
            try:
                if not await rules.check_present():
                    log.warning("service proxy: table ip %s is gone; rebuilding", rules.table)
                    dirty.set()
            except nft.NftError as e:
                log.warning("service proxy: cannot list tables: %s", e)

    try:
        async with trio.open_nursery() as n:
            owned = [inf for inf, own in ((services, own_services), (slices, own_slices))
                     if own] + [nodes]
            for inf in owned:
                await n.start(inf.run)
            # Shared informers run elsewhere: sync only once they have listed too.
            for inf in (services, slices):
                await inf.wait_synced()
            started = False
            backoff = cfg.retry_backoff
            n.start_soon(checker)
            while True:
                if started:
                    # Wait for a change, or for held stale chains to be due for deletion.
                    cleanup = rules.next_cleanup()
                    with trio.move_on_after(cleanup if cleanup is not None else float("inf")):
                        await dirty.wait()
                    # Let a burst of changes (a rollout, a relist) land in one transaction.
                    await trio.sleep(cfg.min_sync_interval)
                dirty = trio.Event()
                try:
                    await sync_now()
                except (nft.NftError, OSError) as e:
                    log.warning("service proxy: sync failed: %s; retrying in %.1fs", e, backoff)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    dirty.set()
                    continue
                backoff = cfg.retry_backoff
                if not started:
                    started = True
                    task_status.started(rules)
    finally:
        if not own_services:
            services.remove_handler(changed)
        if not own_slices:
            slices.remove_handler(changed)


__all__ = [
    "RULES",
    "SYNC_SECONDS",
    "ServiceProxyConfig",
    "ServiceRules",
    "SyncResult",
    "node_addresses",
    "run_service_proxy",
]
