"""The ingress component of `fleet server`: informers → route table → engine, statuses, events.

The thin I/O loop around the pure builder (`fleet.network.routebuild.build`) and the
pure write-side decisions (`fleet.network.ingress_status`):

* Nine informers (Ingresses, IngressClasses, GatewayClasses, Gateways, HTTPRoutes,
  Services, EndpointSlices, Secrets, Namespaces) mark the controller dirty when an
  object changes in a way the builder can see (a change of status or resourceVersion
  only — our own status writes — does not).  One loop coalesces changes for
  `min_sync_interval`, as the node's service proxy does, and builds only once every
  informer has listed: the engine never serves a table built from empty caches.
* Build (in a worker thread, on a snapshot of the caches) → `engine.apply(table)`.
  An engine that refuses a table is logged and counted
  (`fleet_ingress_sync_failures_total`) and retried with back-off; the previous table
  stays in force (the engines swap tables whole).  A table equal to the one applied
  (ignoring its generation) is not applied again.
* After a successful apply, the statuses the builder asked for are written through
  the status subresource as merge patches — only those that differ from the
  informer's copy; a 404 (the object went) is ignored, any other failure makes the
  next pass try again.  An Ingress we stopped serving (its class changed) that still
  shows our addresses gets its `status.loadBalancer` emptied.  Events go through the shared EventRecorder, each once while
  its condition lasts (`EventDeduper`).
* At start: the IngressClass `fleet` (the default class) and the GatewayClass `fleet`
  are created when absent (never overwritten: a user's edits stay), and the default
  TLS certificate is loaded or made (`fleet.network.ingress_cert`).

Metrics (process-wide registry, so on the server's /metrics):
`fleet_ingress_requests_total{kind,namespace,name,code}` and
`fleet_ingress_request_duration_seconds{kind,namespace,name}` (fed by the engine
through `EngineOptions.observe`; a request no route matched has empty labels),
`fleet_ingress_sync_seconds`, `fleet_ingress_sync_failures_total`,
`fleet_ingress_status_write_failures_total`.  A route object's request series go
once it is no longer in the served table.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio
from prometheus_client import Counter, Histogram

from fleet._core.supervise import REGISTRY
from fleet.api.meta import now_rfc3339
from fleet.client import MERGE_PATCH, ApiException, Client, ClientConfig
from fleet.client.events import EventRecorder
from fleet.network.ingress_cert import ensure_default_certificate
from fleet.network.ingress_status import KINDS, EventDeduper, pending_writes, released
from fleet.network.routebuild_ingress import load_balancer_status
from fleet.network.routetable import (
    BuildResult,
    Certificate,
    Engine,
    EngineError,
    EngineOptions,
    RouteEvent,
    RouteTable,
    Source,
)

log = logging.getLogger(__name__)

INGRESS_CONTROLLER = "fleet.io/ingress"
GATEWAY_CONTROLLER = "fleet.io/gateway-controller"
CLASS_NAME = "fleet"
DEFAULT_CLASS_ANNOTATION = "ingressclass.kubernetes.io/is-default-class"
COMPONENT = "fleet-ingress"
#: Builds per pass, each leaving out the ports the engine could not listen on.
MAX_PORT_RETRIES = 4
#: Seconds before ports the engine could not listen on are tried again.
UNAVAILABLE_RETRY = 30.0

REQUESTS = Counter("fleet_ingress_requests", "Requests the ingress proxied, by route object and status code.",
                   ["kind", "namespace", "name", "code"], registry=REGISTRY)
REQUEST_SECONDS = Histogram(
    "fleet_ingress_request_duration_seconds", "Time from a request's arrival to its response's end.",
    ["kind", "namespace", "name"], registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
SYNC_SECONDS = Histogram("fleet_ingress_sync_seconds", "Time to build the route table and apply it.",
                         registry=REGISTRY, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
SYNC_FAILURES = Counter("fleet_ingress_sync_failures", "Route tables an engine failed to apply (or builds "
                        "that raised); the previous table stayed in force.", registry=REGISTRY)
STATUS_WRITE_FAILURES = Counter("fleet_ingress_status_write_failures",
                                "Status writes to Ingresses, Gateways and routes that failed (retried).",
                                registry=REGISTRY)


#: (kind, namespace, name) → the codes with a request series: what `forget_routes` removes.
_SERIES: dict[tuple[str, str, str], set[str]] = {}


def observe(source: Source | None, code: int, seconds: float) -> None:
    """`EngineOptions.observe`: one proxied request into the two request metrics."""
    key = (source.kind, source.namespace, source.name) if source is not None else ("", "", "")
    REQUESTS.labels(*key, str(code)).inc()
    REQUEST_SECONDS.labels(*key).observe(seconds)
    _SERIES.setdefault(key, set()).add(str(code))


def forget_routes(active: set[tuple[str, str, str]]) -> None:
    """Drop the request series of route objects no longer in the served table (a
    deleted Ingress must not stay on /metrics forever); the no-route series stays."""
    for key in [k for k in _SERIES if k != ("", "", "") and k not in active]:
        for code in _SERIES.pop(key):
            with contextlib.suppress(KeyError):
                REQUESTS.remove(*key, code)
        with contextlib.suppress(KeyError):
            REQUEST_SECONDS.remove(*key)


def table_sources(table: RouteTable) -> set[tuple[str, str, str]]:
    return {(r.source.kind, r.source.namespace, r.source.name)
            for lst in table.listeners for vh in lst.hosts for r in vh.routes}


@dataclass
class IngressConfig:
    """The server's ingress settings (`--ingress-*` flags)."""

    enabled: bool = True
    bind_address: str = "0.0.0.0"
    http_port: int = 8080  # 0: no HTTP listener
    https_port: int = 8443  # 0: no HTTPS listener
    engine: str = "builtin"  # "builtin" (fleet.network.ingress_proxy) or "nginx"
    # Addresses written into Ingress status.loadBalancer and Gateway status.addresses;
    # empty: the bind address, for a wildcard bind the default-route interface's.
    advertise: list[str] = field(default_factory=list)
    # The server's data dir: the default certificate (and, unless runtime_dir, the
    # engine's files) live in <data_dir>/ingress.
    data_dir: Path | None = None
    runtime_dir: str = ""
    # The server's --advertise-address or --address (the default advertised address).
    server_address: str = ""
    connect_timeout: float = 5.0
    response_timeout: float = 60.0
    keepalive_timeout: float = 75.0
    min_sync_interval: float = 0.1
    retry_backoff: float = 1.0

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.http_port or self.https_port)

    def validate(self) -> None:
        """ValueError for a bad flag (the CLI checks before anything starts)."""
        if self.engine not in ("builtin", "nginx"):
            raise ValueError(f"--ingress-engine {self.engine!r}: must be builtin or nginx")
        for p in (self.http_port, self.https_port):
            if not 0 <= p <= 65535:
                raise ValueError(f"ingress port {p}: must be between 0 and 65535")
        if self.http_port and self.http_port == self.https_port:
            raise ValueError("--ingress-http-port and --ingress-https-port must differ")
        try:
            ipaddress.ip_address(self.bind_address)
        except ValueError:
            raise ValueError(f"--ingress-bind {self.bind_address!r}: not an IP address") from None

    def addresses(self) -> tuple[str, ...]:
        """`advertise`, else as --cluster-dns-advertise: a specific bind host, else the
        server's advertised (non-loopback) address, else the default-route interface's."""
        if self.advertise:
            return tuple(self.advertise)
        from fleet.network.cluster_dns import ClusterDNSConfig, advertised_address
        return (advertised_address(ClusterDNSConfig(), self.bind_address, self.server_address),)

    def ingress_dir(self) -> Path:
        return Path(self.data_dir or "/var/lib/fleet") / "ingress"

    def engine_dir(self) -> str:
        """Where the engine keeps its files.  The nginx engine writes the TLS keys of
        Secrets there, so they belong on a tmpfs, never on a disk: a directory of its
        own per server (named by the data dir) under /run, or else /dev/shm, when it is
        a writable tmpfs; <data-dir>/ingress/engine only when neither is."""
        if self.runtime_dir:
            return self.runtime_dir
        digest = hashlib.sha256(str(self.ingress_dir().resolve()).encode()).hexdigest()[:12]
        for base in ("/run", "/dev/shm"):
            if _is_tmpfs(base) and os.access(base, os.W_OK):
                return f"{base}/fleet/ingress-{digest}"
        return str(self.ingress_dir() / "engine")

    def engine_options(self) -> EngineOptions:
        return EngineOptions(bind_address=self.bind_address, connect_timeout=self.connect_timeout,
                             response_timeout=self.response_timeout,
                             keepalive_timeout=self.keepalive_timeout, observe=observe,
                             runtime_dir=self.engine_dir())


def _is_tmpfs(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return False
    return any(len(m) > 2 and m[1] == path and m[2] == "tmpfs" for m in mounts)


def make_engine(cfg: IngressConfig) -> Engine:
    opts = cfg.engine_options()
    if cfg.engine == "nginx":
        from fleet.network.ingress_nginx import NginxEngine
        return NginxEngine(opts)
    from fleet.network.ingress_proxy import ProxyEngine
    return ProxyEngine(opts)


#: BuildInput field → (apiVersion, plural) of the informer feeding it.
INPUTS: dict[str, tuple[str, str]] = {
    "ingresses": ("networking.k8s.io/v1", "ingresses"),
    "ingress_classes": ("networking.k8s.io/v1", "ingressclasses"),
    "gateway_classes": ("gateway.networking.k8s.io/v1", "gatewayclasses"),
    "gateways": ("gateway.networking.k8s.io/v1", "gateways"),
    "http_routes": ("gateway.networking.k8s.io/v1", "httproutes"),
    "services": ("v1", "services"),
    "endpoint_slices": ("discovery.k8s.io/v1", "endpointslices"),
    "secrets": ("v1", "secrets"),
    "namespaces": ("v1", "namespaces"),
}
#: The informer holding each kind the builder reports statuses and events about.
KIND_INPUT = {"Ingress": "ingresses", "IngressClass": "ingress_classes", "GatewayClass": "gateway_classes",
              "Gateway": "gateways", "HTTPRoute": "http_routes", "Service": "services",
              "Secret": "secrets", "Namespace": "namespaces"}

TLS_SECRET = "kubernetes.io/tls"


def slim_secret(obj: dict[str, Any]) -> dict[str, Any]:
    """Informer transform: only TLS Secrets' data is kept (the rest never reaches the
    builder, and need not sit in this process' memory)."""
    if obj.get("type") == TLS_SECRET:
        return obj
    return {k: v for k, v in obj.items() if k not in ("data", "stringData")}


def relevant_change(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a change can matter to the builder: not when only status or bookkeeping
    metadata moved (our own status writes come back as such events)."""
    if old is None or new is None:
        return True

    def essence(o: Mapping[str, Any]) -> tuple[Any, ...]:
        md = dict(o.get("metadata") or {})
        for k in ("resourceVersion", "managedFields"):
            md.pop(k, None)
        rest = {k: v for k, v in o.items() if k not in ("metadata", "status")}
        # A Service's status is not an input, but an object's other top-level fields
        # (EndpointSlice endpoints, Secret data) are.
        return md, rest
    return essence(old) != essence(new)


class Cache(Protocol):
    """What the controller reads of an informer."""

    items: dict[str, dict[str, Any]]

    @property
    def has_synced(self) -> bool: ...


#: (inputs by name, generation, ports the engine could not listen on) → the build.
BuildFn = Callable[[dict[str, list[dict[str, Any]]], int, frozenset[int]], BuildResult]


def default_build(cfg: IngressConfig, default_certificate: Certificate | None) -> BuildFn:
    """`fleet.network.routebuild.build` with this server's options."""
    from fleet.network.routebuild import BuildInput, BuildOptions, build

    addresses = cfg.addresses()

    def run(inputs: dict[str, list[dict[str, Any]]], generation: int,
            unavailable: frozenset[int] = frozenset()) -> BuildResult:
        opts = BuildOptions(ingress_controller=INGRESS_CONTROLLER, gateway_controller=GATEWAY_CONTROLLER,
                            http_port=cfg.http_port, https_port=cfg.https_port, addresses=addresses,
                            default_certificate=default_certificate, generation=generation,
                            unavailable_ports=unavailable)
        return build(BuildInput(**inputs), opts)
    return run


def _same_table(a: RouteTable | None, b: RouteTable) -> bool:
    return a is not None and replace(a, generation=0) == replace(b, generation=0)


class IngressController:
    """One build → apply → write pass at a time, over the informers' caches."""

    def __init__(self, engine: Engine, client: Any, recorder: EventRecorder | Any,
                 caches: Mapping[str, Cache], build: BuildFn, *,
                 gateway_controller: str = GATEWAY_CONTROLLER,
                 addresses: tuple[str, ...] = (),
                 build_in_thread: bool = True) -> None:
        self.engine = engine
        self.client = client
        self.recorder = recorder
        self.caches = caches
        self.build = build
        self.gateway_controller = gateway_controller
        # Ingress status.loadBalancer as we write it: an Ingress we stop serving that
        # still shows it is released (`ingress_status.released`).
        self.load_balancer = load_balancer_status(addresses) if addresses else None
        self.build_in_thread = build_in_thread
        self.generation = 0
        self.applied: RouteTable | None = None  # the table the engine serves
        self.events = EventDeduper()
        # (input, "ns/name") → the status last asked for: see `handler`.
        self.wanted: dict[tuple[str, str], dict[str, Any]] = {}
        self.dirty = trio.Event()
        self._lock = trio.Lock()
        # Ports the engine could not listen on (EngineError.ports): built without, and
        # tried again every `UNAVAILABLE_RETRY` seconds (`loop`).
        self.unavailable: frozenset[int] = frozenset()
        self.unavailable_since = 0.0

    def handler(self, input_name: str) -> Callable[[str, Any, Any], None]:
        """The handler for one input's informer: marks the controller dirty on a
        change the builder can see (`relevant_change`); a status-only change
        also counts when it is not the status this controller last asked for (someone
        else wrote it: it is put back)."""
        def on_event(etype: str, old: Any, new: Any) -> None:
            if relevant_change(old, new):
                self.dirty.set()
            elif old is not None and new is not None and old.get("status") != new.get("status"):
                key = (input_name, f"{(new.get('metadata') or {}).get('namespace') or ''}/"
                                   f"{(new.get('metadata') or {}).get('name')}")
                if key in self.wanted and self.wanted[key] != new.get("status"):
                    self.dirty.set()
        return on_event

    def synced(self) -> bool:
        return all(c.has_synced for c in self.caches.values())

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        return {name: list(self.caches[name].items.values()) if name in self.caches else []
                for name in INPUTS}

    def lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        cache = self.caches.get(KIND_INPUT.get(kind, ""))
        return None if cache is None else cache.items.get(f"{namespace or ''}/{name}")

    async def sync(self) -> bool:
        """One pass; True when the engine serves the new table and every status is written."""
        async with self._lock:
            self.generation += 1
            inputs, gen = self.snapshot(), self.generation
            t0 = time.perf_counter()
            # A port the engine cannot listen on is left out and the table built and
            # applied again (up to MAX_PORT_RETRIES builds), so it never holds up the rest.
            for _attempt in range(MAX_PORT_RETRIES):
                try:
                    if self.build_in_thread:
                        result = await trio.to_thread.run_sync(self.build, inputs, gen, self.unavailable)
                    else:
                        result = self.build(inputs, gen, self.unavailable)
                except Exception:
                    SYNC_FAILURES.inc()
                    log.exception("ingress: building the route table failed; the previous one stays")
                    return False
                self.record_events(result.events)
                if _same_table(self.applied, result.table):
                    break
                try:
                    await self.engine.apply(result.table)
                except EngineError as e:
                    if e.ports and not e.ports <= self.unavailable:
                        log.warning("ingress: engine %s cannot listen on port(s) %s: %s; serving "
                                    "without them", getattr(self.engine, "name", "?"),
                                    ", ".join(map(str, sorted(e.ports))), e)
                        if not self.unavailable:
                            self.unavailable_since = trio.current_time()
                        self.unavailable |= e.ports
                        continue
                    return self._refused(gen, e)
                except Exception as e:  # noqa: BLE001 - any engine failure: keep serving the old table
                    return self._refused(gen, e)
                self.applied = result.table
                forget_routes(table_sources(result.table))
                log.info("ingress: engine %s serves table %d (%d listener(s)) after %.3fs",
                         getattr(self.engine, "name", "?"), gen, len(result.table.listeners),
                         time.perf_counter() - t0)
                break
            else:
                return self._refused(gen, EngineError(f"ports still failing after {MAX_PORT_RETRIES} tries"))
            SYNC_SECONDS.observe(time.perf_counter() - t0)
            return await self.write_statuses(result)

    def _refused(self, generation: int, e: Exception) -> bool:
        SYNC_FAILURES.inc()
        log.warning("ingress: engine %s refused table %d: %s; the previous table stays",
                    getattr(self.engine, "name", "?"), generation, e)
        return False

    def record_events(self, events: tuple[RouteEvent, ...]) -> None:
        for ev in self.events.new(events):
            ref = _reference(ev)
            obj = self.lookup(ev.kind, ev.namespace, ev.name)
            # List items may come without kind/apiVersion; the Event's reference needs them.
            obj = {**obj, "apiVersion": ref["apiVersion"], "kind": ev.kind} if obj is not None else ref
            self.recorder.record(obj, ev.type, ev.reason, ev.message)

    async def write_statuses(self, result: BuildResult) -> bool:
        ok = True
        updates = list(result.statuses)
        if self.load_balancer is not None and "ingresses" in self.caches:
            updates += released(self.caches["ingresses"].items.values(), result.statuses, self.load_balancer)
        writes = pending_writes(updates, self.lookup, self.gateway_controller, now_rfc3339())
        self.wanted = {(KIND_INPUT[u.kind], f"{u.namespace or ''}/{u.name}"): want for u, want, _ in writes}
        for update, _want, patch in writes:
            if patch is None:
                continue
            plural, cluster = KINDS[update.kind]
            try:
                await self.client.patch(update.api_version, plural, update.name, {"status": patch},
                                        MERGE_PATCH, None if cluster else update.namespace,
                                        subresource="status")
            except ApiException as e:
                if e.code == 404:
                    continue  # deleted since the build: its informer will tell us
                STATUS_WRITE_FAILURES.inc()
                log.warning("ingress: status of %s %s/%s not written: %s", update.kind, update.namespace,
                            update.name, e)
                ok = False
            except (OSError, trio.TooSlowError) as e:
                STATUS_WRITE_FAILURES.inc()
                log.warning("ingress: status of %s %s/%s not written: %r", update.kind, update.namespace,
                            update.name, e)
                ok = False
        return ok

    async def loop(self, *, min_interval: float = 0.1, retry_backoff: float = 1.0,
                   task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pass after pass while changes come; `started` after the first successful apply."""
        started = False
        backoff = retry_backoff
        while True:
            if not self.synced():
                # An informer that listed nothing calls no handler: poll until all have.
                await trio.sleep(max(min_interval, 0.05))
                continue
            if started:
                # Ports left out for want of a listening socket are tried again now and
                # then (whoever held them may have let go).
                retry_at = self.unavailable_since + UNAVAILABLE_RETRY if self.unavailable else math.inf
                with trio.move_on_at(retry_at):
                    await self.dirty.wait()
                if trio.current_time() >= retry_at:
                    self.unavailable = frozenset()
                await trio.sleep(min_interval)  # a burst of changes lands in one pass
            self.dirty = trio.Event()
            if await self.sync():
                backoff = retry_backoff
            else:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                self.dirty.set()
            if not started and self.applied is not None:
                started = True
                task_status.started()


def _reference(ev: RouteEvent) -> dict[str, Any]:
    """A stand-in for an object the caches do not hold (yet): enough for an Event."""
    api = {"Ingress": "networking.k8s.io/v1", "IngressClass": "networking.k8s.io/v1", "Service": "v1",
           "Secret": "v1", "Namespace": "v1"}.get(ev.kind, "gateway.networking.k8s.io/v1")
    md: dict[str, Any] = {"name": ev.name}
    if ev.namespace:
        md["namespace"] = ev.namespace
    return {"apiVersion": api, "kind": ev.kind, "metadata": md}


def default_ingress_class() -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": CLASS_NAME, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"controller": INGRESS_CONTROLLER}}


def default_gateway_class() -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": CLASS_NAME}, "spec": {"controllerName": GATEWAY_CONTROLLER}}


async def ensure_classes(client: Any) -> None:
    """Create the IngressClass and GatewayClass `fleet` when absent; an existing one
    (a user's edit included) is left as it is."""
    for body, plural in ((default_ingress_class(), "ingressclasses"),
                         (default_gateway_class(), "gatewayclasses")):
        try:
            await client.create(body["apiVersion"], plural, body)
            log.info("ingress: created %s %s", body["kind"], CLASS_NAME)
        except ApiException as e:
            if e.code == 409:
                continue
            log.warning("ingress: cannot create %s %s: %s", body["kind"], CLASS_NAME, e)


def wire(controller: IngressController, client: Client) -> dict[str, Any]:
    """The nine informers (not started), each feeding `controller.handler(input)`."""
    from fleet.client.informer import Informer

    infs: dict[str, Any] = {}
    for name, (api_version, plural) in INPUTS.items():
        inf = Informer(client, api_version, plural, component="ingress",
                       transform=slim_secret if plural == "secrets" else None)
        inf.add_handler(controller.handler(name))
        infs[name] = inf
    return infs


async def run_ingress(cfg: IngressConfig, client_cfg: ClientConfig, *,
                      engine_factory: Callable[[IngressConfig], Engine] = make_engine,
                      task_status: trio.TaskStatus[IngressController] = trio.TASK_STATUS_IGNORED) -> None:
    """The server's ingress task; `started(controller)` once the engine serves the first table."""
    certificate = await trio.to_thread.run_sync(ensure_default_certificate, cfg.ingress_dir())
    engine = engine_factory(cfg)
    async with Client(client_cfg, user_agent=COMPONENT) as client, trio.open_nursery() as nursery:
        await ensure_classes(client)
        recorder = EventRecorder(client, COMPONENT)
        await nursery.start(recorder.run)
        caches: dict[str, Any] = {}
        controller = IngressController(engine, client, recorder, caches, default_build(cfg, certificate),
                                       addresses=cfg.addresses())
        caches.update(wire(controller, client))
        await nursery.start(engine.run)
        for inf in caches.values():
            nursery.start_soon(inf.run)  # not `start`: one kind the API lacks must not hold the rest
        controller.dirty.set()
        await nursery.start(partial(controller.loop, min_interval=cfg.min_sync_interval,
                                    retry_backoff=cfg.retry_backoff))
        log.info("ingress: engine %s on %s (HTTP %s, HTTPS %s), advertised as %s", engine.name,
                 cfg.bind_address, cfg.http_port or "off", cfg.https_port or "off",
                 ", ".join(cfg.addresses()))
        task_status.started(controller)


__all__ = ["GATEWAY_CONTROLLER", "INGRESS_CONTROLLER", "INPUTS", "REQUESTS", "REQUEST_SECONDS",
           "SYNC_FAILURES", "SYNC_SECONDS", "IngressConfig", "IngressController", "ensure_classes",
           "make_engine", "observe", "relevant_change", "run_ingress", "slim_secret", "wire"]
