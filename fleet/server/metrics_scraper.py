"""The scraping half of the resource metrics API (metrics-server's job): every
`resolution` seconds each real node's agent is asked for `/metrics/resource`,
its Prometheus text parsed, and cpu rates derived from two scrapes of the same
counters, timed by the agent's clock.  `MetricsScraper` keeps the latest usage
per node and pod in memory; `ResourceMetrics` (resource_metrics.py) serves it
as `metrics.k8s.io`.  It lives in the API server because the serving side
reads this memory directly.
"""

from __future__ import annotations

import logging
import math
import re
import ssl
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import trio

from fleet.api import errors, meta
from fleet.api.kinds import metrics as mk
from fleet.api.registry import Registry
from fleet.server.proxy import agent_address
from fleet.store import Store
from fleet.store.watchcache import WatchCache

log = logging.getLogger(__name__)

DEFAULT_RESOLUTION = 15.0  # metrics-server's --metric-resolution
DEFAULT_CONCURRENCY = 16
METRICS_PATH = "/metrics/resource"
NODES_PREFIX = meta.store_key("", "nodes", None)

PodKey = tuple[str, str]  # (namespace, pod name)
ContainerKey = tuple[str, str, str]  # (namespace, pod name, container name)


# ---------------------------------------------------------------------------------------
# Parsing the agent's answer


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float, int | None]]:
    """(name, labels, value, timestamp ms or None) of every sample in Prometheus text format.

    Comments, blank and malformed lines are skipped: one bad line must not
    cost a node all its metrics.
    """
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels: dict[str, str] = {}
        if m.group(3):
            for lm in _LABEL.finditer(m.group(3)):
                labels[lm.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)],
                                             lm.group(2))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out.append((m.group(1), labels, value, int(m.group(5)) if m.group(5) else None))
    return out


@dataclass
class ContainerSample:
    """One container's counters at one moment (agent clock, milliseconds)."""

    ts_ms: int
    cpu_seconds: float | None = None
    memory_bytes: float | None = None
    start_seconds: float | None = None


@dataclass
class NodeScrape:
    """What one scrape of a node's agent said."""

    ts_ms: int
    cpu_seconds: float | None = None
    memory_bytes: float | None = None
    containers: dict[ContainerKey, ContainerSample] = field(default_factory=dict)


def parse_resource_metrics(text: str, received_ms: int) -> NodeScrape:
    """The node and container samples of a `/metrics/resource` answer.

    Samples without a timestamp take `received_ms` (when the answer arrived).
    """
    scrape = NodeScrape(ts_ms=received_ms)
    node_ts: int | None = None
    for name, labels, value, ts in parse_prometheus(text):
        ts_ms = ts if ts is not None else received_ms
        if name in ("node_cpu_usage_seconds_total", "node_memory_working_set_bytes"):
            node_ts = ts_ms if node_ts is None else max(node_ts, ts_ms)
            if name == "node_cpu_usage_seconds_total":
                scrape.cpu_seconds = value
            else:
                scrape.memory_bytes = value
            continue
        if not name.startswith("container_"):
            continue
        key = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
        if not all(key):
            continue
        sample = scrape.containers.get(key)
        if sample is None:
            sample = scrape.containers[key] = ContainerSample(ts_ms=ts_ms)
        if name == "container_cpu_usage_seconds_total":
            sample.cpu_seconds = value
            sample.ts_ms = ts_ms  # the cpu reading's time is what the rate divides by
        elif name == "container_memory_working_set_bytes":
            sample.memory_bytes = value
        elif name == "container_start_time_seconds":
            sample.start_seconds = value
    if node_ts is not None:
        scrape.ts_ms = node_ts
    return scrape


# ---------------------------------------------------------------------------------------
# Rates


@dataclass(frozen=True)
class Usage:
    """Usage over a window ending at `ts_ms` (epoch milliseconds)."""

    cpu_nanocores: int
    memory_bytes: int
    ts_ms: int
    window: float  # seconds


@dataclass(frozen=True)
class PodUsage:
    node: str
    containers: tuple[tuple[str, int, int], ...]  # (name, cpu nanocores, memory bytes)
    ts_ms: int
    window: float


def _rate(prev_cpu: float | None, prev_ms: int, cpu: float | None, ms: int) -> int | None:
    """Nanocores between two cumulative readings; None when they do not make a rate."""
    if prev_cpu is None or cpu is None or ms <= prev_ms or cpu < prev_cpu:
        return None
    return int((cpu - prev_cpu) * 1e9 * 1000 / (ms - prev_ms))


def usage_between(node: str, prev: NodeScrape | None,
                  cur: NodeScrape) -> tuple[Usage | None, dict[PodKey, PodUsage]]:
    """The node's and its pods' usage from two consecutive scrapes (pure).

    A container counts only if the previous scrape saw it with the same start
    time (a restart begins a new series) and its cpu counter did not go
    backwards; a pod counts only if all its containers in `cur` do.
    """
    if prev is None:
        return None, {}
    node_usage = None
    rate = _rate(prev.cpu_seconds, prev.ts_ms, cur.cpu_seconds, cur.ts_ms)
    if rate is not None and cur.memory_bytes is not None:
        node_usage = Usage(rate, int(cur.memory_bytes), cur.ts_ms,
                           (cur.ts_ms - prev.ts_ms) / 1000)
    by_pod: dict[PodKey, list[tuple[str, int, int, int, float] | None]] = {}
    for (ns, pod, cname), c in cur.containers.items():
        entries = by_pod.setdefault((ns, pod), [])
        p = prev.containers.get((ns, pod, cname))
        restarted = (p is not None and p.start_seconds is not None and c.start_seconds is not None
                     and abs(p.start_seconds - c.start_seconds) > 0.001)
        r = None if p is None or restarted else _rate(p.cpu_seconds, p.ts_ms, c.cpu_seconds,
                                                      c.ts_ms)
        if r is None or c.memory_bytes is None or p is None:
            entries.append(None)
            continue
        entries.append((cname, r, int(c.memory_bytes), c.ts_ms, (c.ts_ms - p.ts_ms) / 1000))
    pods: dict[PodKey, PodUsage] = {}
    for key, entries in by_pod.items():
        if not entries or any(e is None for e in entries):
            continue
        done = [e for e in entries if e is not None]
        done.sort(key=lambda e: e[0])
        pods[key] = PodUsage(node, tuple((n, cpu, mem) for n, cpu, mem, _, _ in done),
                             max(e[3] for e in done), max(e[4] for e in done))
    return node_usage, pods


def _rfc3339_ms(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

class MetricsScraper:
    """Scrapes the agents and keeps the latest node and pod usage (see the module docstring).

    `run` is a service of `fleet server` (started in run.py).
    """

    def __init__(self, store: Store, registry: Registry, token: str | None, *,
                 resolution: float = DEFAULT_RESOLUTION, concurrency: int = DEFAULT_CONCURRENCY,
                 transport: httpx.AsyncBaseTransport | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.store = store
        self.registry = registry
        self.token = token
        # The agent client context (fleet.server.proxy: server CA trust, the server's
        # client certificate) for agents served over HTTPS.
        self.tls = tls
        self.resolution = resolution
        self.concurrency = concurrency
        self._transport = transport
        self.nodes = WatchCache(NODES_PREFIX)  # kept by a store watch
        self._last: dict[str, NodeScrape] = {}
        self._node_usage: dict[str, Usage] = {}
        self._pods_of: dict[str, dict[PodKey, PodUsage]] = {}
        self._pods: dict[PodKey, PodUsage] = {}
        self.scrapes = 0  # completed rounds, for tests
        self._round_done = trio.Event()
        self._warned: dict[str, float] = {}

    # -- scraping -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._watch_nodes)
            timeout = httpx.Timeout(max(1.0, min(10.0, self.resolution * 0.8)))
            async with httpx.AsyncClient(timeout=timeout, transport=self._transport,
                                         verify=self.tls if self.tls is not None else True,
                                         limits=httpx.Limits(max_keepalive_connections=64)) as http:
                task_status.started()
                while True:
                    start = trio.current_time()
                    try:
                        await self.scrape_all(http)
                    except Exception:  # a bug here must not take the API server down
                        log.exception("resource metrics: scrape round failed")
                    # (A floor, so a misconfigured resolution cannot spin the loop.)
                    await trio.sleep_until(start + max(0.1, self.resolution))

    async def wait_round(self) -> None:
        """Wait for the next scrape round to finish (tests)."""
        await self._round_done.wait()

    async def scrape_all(self, http: httpx.AsyncClient) -> None:
        """One round: scrape every real node at once (bounded), drop what is gone."""
        targets = [(name, node) for name, node in self.nodes.items()
                   if not mk.is_simulated_node(node)]
        limiter = trio.CapacityLimiter(self.concurrency)
        # A node that hangs must not delay the next round.
        with trio.move_on_after(max(0.5, self.resolution * 0.9)):
            async with trio.open_nursery() as nursery:
                for name, node in targets:
                    nursery.start_soon(self._scrape_one, http, limiter, name, node)
        for name in list(self._last):
            if name not in self.nodes or mk.is_simulated_node(self.nodes.get(name)):
                self._forget(name)
        self.scrapes += 1
        self._round_done.set()
        self._round_done = trio.Event()

    async def _scrape_one(self, http: httpx.AsyncClient, limiter: trio.CapacityLimiter,
                          name: str, node: dict[str, Any]) -> None:
        ok = False
        try:
            async with limiter:
                scrape = await self.fetch(http, name, node)
            ok = True
        except (errors.APIError, httpx.HTTPError, OSError, ValueError) as e:
            self._warn(name, f"scraping the agent of node {name} failed: {e}")
        except Exception:  # noqa: BLE001 - one odd node must not end the round for all
            log.exception("resource metrics: scraping node %s", name)
        finally:
            if not ok:  # failed or cancelled by the round's deadline
                self._forget(name)
        if ok:
            self.record(name, scrape)

    async def fetch(self, http: httpx.AsyncClient, name: str, node: dict[str, Any]) -> NodeScrape:
        addr = agent_address(node)
        headers = ({"Authorization": f"Bearer {self.token}"}
                   if self.token and addr.scheme == "http" else {})
        resp = await http.get(addr.url(METRICS_PATH), headers=headers)
        if resp.status_code != 200:
            raise ValueError(f"the agent answered {resp.status_code}")
        return parse_resource_metrics(resp.text, time.time_ns() // 1_000_000)

    def record(self, name: str, scrape: NodeScrape) -> None:
        """Fold one node's scrape into the latest usage (the prior scrape becomes `prev`)."""
        node_usage, pods = usage_between(name, self._last.get(name), scrape)
        self._last[name] = scrape
        if node_usage is None:
            self._node_usage.pop(name, None)
        else:
            self._node_usage[name] = node_usage
        for key in self._pods_of.get(name, {}):
            if self._pods.get(key) is not None and self._pods[key].node == name:
                del self._pods[key]
        self._pods_of[name] = pods
        self._pods.update(pods)

    def _forget(self, name: str) -> None:
        self._last.pop(name, None)
        self._node_usage.pop(name, None)
        for key in self._pods_of.pop(name, {}):
            if self._pods.get(key) is not None and self._pods[key].node == name:
                del self._pods[key]

    def _warn(self, name: str, message: str) -> None:
        # One line per node per minute: an agent that is down would otherwise log every round.
        now = time.monotonic()
        if now - self._warned.get(name, -math.inf) >= 60:
            self._warned[name] = now
            log.warning("resource metrics: %s", message)
        else:
            log.debug("resource metrics: %s", message)

    async def _watch_nodes(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
        await self.nodes.run(self.store, task_status=task_status)

    # -- answering ------------------------------------------------------------------------


__all__ = ["ContainerSample", "MetricsScraper", "NodeScrape", "PodUsage", "Usage",
           "parse_prometheus", "parse_resource_metrics", "usage_between"]
