"""`fleet server`: the store, the API, metrics and the controller manager in one nursery.

Start-up order follows nesting (DESIGN.md): the store opens first and closes
last; the API and metrics listeners start only after the default namespaces
and the system PriorityClasses exist, and `task_status.started()` fires when the API answers — which is also
when the admin kubeconfig is written and its path printed.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve
from quart_trio import QuartTrio

from fleet import scheduler
from fleet._core import memory
from fleet._core.supervise import supervise
from fleet.admission import builtin_chain, limitranger, podsecurity, resourcequota
from fleet.admission.defaultingressclass import IngressClassCache
from fleet.admission.defaultstorageclass import StorageClassCache
from fleet.admission.objcache import NamespacedCache
from fleet.admission.policy import ParamCaches, ValidatingAdmissionPolicy, policy_caches
from fleet.admission.priority import ClassCache
from fleet.admission.serviceaccount import ServiceAccountCache
from fleet.admission.webhook import (
    MUTATING_PREFIX,
    VALIDATING_PREFIX,
    WebhookConfigCache,
    webhook_plugins,
)
from fleet.api import meta
from fleet.api.kinds.scheduling import system_priority_classes
from fleet.api.registry import Registry, default_registry
from fleet.auth import (
    KUBE_CONTROLLER_MANAGER_USER,
    KUBE_SCHEDULER_USER,
    NODE_USER_PREFIX,
    NODES_GROUP,
    STORAGE_PROVISIONER_USER,
    bootstrap,
    bootstrap_policy,
    load_or_create_admin_token,
)
from fleet.auth.bootstrap_policy import CLUSTER_DNS_USER, INGRESS_USER
from fleet.auth.certrotation import CertRotator, PKIServingSource, component_client_config
from fleet.auth.pki import KUBELET_CLIENT_USER, MASTERS, ClusterPKI, write_private
from fleet.client import ClientConfig
from fleet.controllers.manager import default_manager
from fleet.controllers.nodeipam import NodeIPAMConfig
from fleet.controllers.nodelifecycle import NodeLifecycleConfig
from fleet.controllers.rootcacertpublisher import RootCAPublisherConfig
from fleet.controllers.runtime import Manager
from fleet.network.cluster_dns import ClusterDNSConfig, kube_dns_spec, run_cluster_dns
from fleet.network.dns import DNSStats
from fleet.network.ingress import IngressConfig, run_ingress
from fleet.server import (
    apiservices,
    crd_controller,
    limits,
    security,
    svcrepair,
    systemsvc,
    tlsconn,
    upgrade,
)
from fleet.server.app import APIServer
from fleet.server.asgi import FleetASGI, create_app
from fleet.server.metrics import Metrics
from fleet.server.nscache import NamespaceCache
from fleet.server.rest import ResourceAPI
from fleet.server.security import SecurityConfig
from fleet.server.storagedefaults import ensure_default_storage
from fleet.server.svcalloc import ServiceAllocator
from fleet.server.svcalloc_range import PortRange, ServiceIPRange
from fleet.server.watch import WatchCounter
from fleet.storage import registry as storage_registry
from fleet.storage.provisioner import server_provisioner
from fleet.store import KeyExists, Store, ValueCodec, open_store
from fleet.store.codec import PLAIN
from fleet.store.encryption import load_codec

if TYPE_CHECKING:
    from fleet.runtime.images.mirrors import RegistriesConfig

log = logging.getLogger(__name__)

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# The TokenRequest subresource's handler key (fleet/server/security.py `Security.handlers`):
# pods get the `kube-api-access-*` token volume only when the server serves it.
TOKEN_REQUEST = ("", "v1", "serviceaccounts", "token")


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/fleet")
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "fleet"


@dataclass
class ServerConfig:
    data_dir: Path = field(default_factory=default_data_dir)
    port: int = 9300
    metrics_port: int = 9302
    address: str = "127.0.0.1"
    retention: int = 10000
    compact_interval: float = 60.0
    sync: str = "FULL"
    cluster_cidr: str = "10.42.0.0/16"
    # Services (fleet/server/svcalloc.py): the ClusterIP range (its first address is
    # the `kubernetes` Service's), the NodePort range, how often the repair loop
    # checks reservations against Services, and the address the `kubernetes`
    # Service's Endpoints point at (None: the listen address).
    service_cidr: str = "10.43.0.0/16"
    service_node_port_range: str = "30000-32767"
    service_repair_interval: float = 60.0
    advertise_address: str | None = None
    # The built-in node agent (like k3s' server): on unless agent=False.
    agent: bool = True
    agent_port: int = 9301
    agent_driver: str = "auto"
    # "bridge" gives pods their own network namespace (needs root); None runs
    # them in the host's network, as the process driver does anyway.
    agent_network: str | None = field(default_factory=lambda: "bridge" if os.geteuid() == 0 else None)
    agent_bridge: str | None = None  # bridge name (default: the driver's, fleet0)
    # NetworkPolicy fails closed on the built-in agent (fleet.agent.netpolicy).
    agent_network_policy_strict: bool = False
    # Storage driver plugin modules (fleet.storage.registry.load_plugins), loaded by
    # the server and passed to the built-in agent.
    storage_plugins: list[str] = field(default_factory=list)
    # The built-in agent's registry mirrors / per-host auth and TLS (a parsed
    # registries.yaml, fleet.runtime.images.mirrors); None: none.
    agent_registries: RegistriesConfig | None = None
    scheduler: bool = True  # the built-in scheduler (off: `fleet scheduler` runs elsewhere)
    # Which controllers run (kube-controller-manager's --controllers): None = all.
    controllers: list[str] | None = None
    # DefaultTolerationSeconds admission: how long pods tolerate the NoExecute
    # not-ready / unreachable taints of a failed node (kube-apiserver's
    # --default-not-ready-toleration-seconds / --default-unreachable-toleration-seconds).
    default_not_ready_toleration_seconds: int = 300
    default_unreachable_toleration_seconds: int = 300
    # Node lifecycle controller (kube-controller-manager's flags of the same names):
    # a node not heard from for the grace period goes Unknown and gets the
    # unreachable NoExecute taint; nodes are tainted at most eviction_rate per
    # second per zone (see fleet/controllers/nodelifecycle/).
    node_monitor_grace_period: float = 40.0
    node_startup_grace_period: float = 60.0
    node_monitor_period: float = 5.0
    node_eviction_rate: float = 0.1
    secondary_node_eviction_rate: float = 0.01
    unhealthy_zone_threshold: float = 0.55
    large_cluster_size_threshold: int = 50
    # Resource metrics (metrics.k8s.io, fleet/server/resource_metrics.py): how often the
    # agents are scraped (metrics-server's --metric-resolution).
    metric_resolution: float = 15.0
    # The HPA controller's sync period (--horizontal-pod-autoscaler-sync-period).
    hpa_sync_period: float = 15.0
    # The EndpointSlice controller's --max-endpoints-per-slice.
    max_endpoints_per_slice: int = 100
    # Slow clients, on the API and metrics ports (fleet/server/limits.py; kube-apiserver's
    # ReadHeaderTimeout and --request-timeout): how long a connection may stay idle
    # between requests or take to send a request's line and headers, how long the
    # TLS handshake may take, and how long a request body may take to arrive (408).
    # Responses that stream (watch, logs -f, exec) are never cut by these.
    keep_alive_timeout: float = limits.DEFAULT_HEADER_TIMEOUT
    tls_handshake_timeout: float = limits.DEFAULT_HEADER_TIMEOUT
    request_body_timeout: float = limits.DEFAULT_BODY_TIMEOUT
    # Cluster DNS (fleet/network/cluster_dns.py): listeners, domain, upstreams; bind "" = off.
    dns: ClusterDNSConfig = field(default_factory=ClusterDNSConfig)
    # Ingress and Gateway API (fleet/network/ingress.py): listeners, engine; off when
    # not enabled or both ports are 0.
    ingress: IngressConfig = field(default_factory=IngressConfig)
    # Authentication, authorization, PKI and audit (fleet/server/security.py).
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # EncryptionConfiguration file (fleet/store/encryption.py): resources stored
    # encrypted; None stores every value as plain JSON.
    encryption_provider_config: Path | None = None


@dataclass
class ServerInfo:
    url: str
    kubeconfig: Path
    token: str
    metrics_url: str
    ca_pem: bytes


async def ensure_system_priority_classes(store: Store, registry: Registry) -> None:
    """Create system-cluster-critical and system-node-critical if missing (as kube-apiserver's
    bootstrap hook does at every start, so a class lost to an old store comes back)."""
    info = registry.get("scheduling.k8s.io", "v1", "priorityclasses")
    assert info is not None
    for obj in system_priority_classes():
        if info.default is not None:
            info.default(obj)
        try:
            await store.create(info.key(None, obj["metadata"]["name"]), obj)
        except KeyExists:
            pass


async def ensure_default_namespaces(store: Store, registry: Registry) -> None:
    info = registry.get("", "v1", "namespaces")
    assert info is not None
    for name in DEFAULT_NAMESPACES:
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        if info.default is not None:
            info.default(obj)
        try:
            await store.create(meta.store_key("", "namespaces", None, name), obj)
        except KeyExists:
            pass


async def ensure_default_service_accounts(store: Store, registry: Registry) -> None:
    """The `default` ServiceAccount of each default namespace, before the API listens.

    The ServiceAccount controller creates them too, but only once the controller
    manager runs; a pod created in the first moments of a new server would otherwise
    wait out the ServiceAccount admission plugin's retries and be refused."""
    info = registry.get("", "v1", "serviceaccounts")
    assert info is not None
    for ns in DEFAULT_NAMESPACES:
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"name": "default", "namespace": ns}}
        if info.default is not None:
            info.default(obj)
        try:
            await store.create(info.key(ns, "default"), obj)
        except KeyExists:
            pass




def kubeconfig_text(url: str, token: str, ca_pem: bytes, client_cert: bytes | None = None,
                    client_key: bytes | None = None) -> str:
    """admin.kubeconfig: the server CA bundle, the admin client certificate
    (O=system:masters) and the static admin token (`<data-dir>/token`)."""
    cert_lines = ""
    if client_cert and client_key:
        cert_lines = (f"    client-certificate-data: {base64.b64encode(client_cert).decode()}\n"
                      f"    client-key-data: {base64.b64encode(client_key).decode()}\n")
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: fleet\n"
        "  cluster:\n"
        f"    server: {url}\n"
        f"    certificate-authority-data: {base64.b64encode(ca_pem).decode()}\n"
        "contexts:\n"
        "- name: fleet\n"
        "  context:\n"
        "    cluster: fleet\n"
        "    user: admin\n"
        "    namespace: default\n"
        "current-context: fleet\n"
        "preferences: {}\n"
        "users:\n"
        "- name: admin\n"
        "  user:\n"
        f"{cert_lines}"
        f"    token: {token}\n"
    )


def write_admin_kubeconfig(path: Path, url: str, token: str, pki: ClusterPKI) -> None:
    cert, key = pki.leaf_pem("admin")
    write_private(path, kubeconfig_text(url, token, pki.server_ca_bundle_pem(), cert, key))


async def _serve(app: QuartTrio | FleetASGI, address: str, port: int,
                 tls: tlsconn.TLSConfig | None = None, *,
                 timeouts: limits.ClientTimeouts | None = None,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    # With TLS the listener's config is `tls` itself: its SSL context is the live one
    # the certificate rotation reloads (fleet/server/tlsconn.py).
    cfg = tls if tls is not None else HyperConfig()
    cfg.bind = [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    (timeouts or limits.ClientTimeouts()).apply(cfg)
    if isinstance(app, FleetASGI):
        upgrade.enable(cfg)  # kubectl port-forward's plain SPDY/3.1 upgrade
    cfg.graceful_timeout = 2
    await serve(app, cfg, task_status=task_status)  # type: ignore[arg-type]


def _metrics_app(metrics: Metrics) -> QuartTrio:
    from quart import Response

    app = QuartTrio("fleet-metrics")

    @app.route("/metrics")
    async def metrics_route() -> Response:
        body, ctype = metrics.render()
        return Response(body, content_type=ctype)

    @app.route("/healthz")
    async def health() -> Response:
        return Response(b"ok", content_type="text/plain")

    return app


async def run(cfg: ServerConfig, *, task_status: trio.TaskStatus[ServerInfo] = trio.TASK_STATUS_IGNORED,
              handle_signals: bool = False) -> None:
    data_dir = Path(cfg.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Storage drivers (in-tree and --storage-plugin ones): a plugin that does not
    # import stops the start, as any bad flag does.
    storage_registry.load_plugins(cfg.storage_plugins)
    token = load_or_create_admin_token(data_dir)
    # The PKI (fleet/auth/pki.py): CAs created at the first start, leaves current.
    pki = security.open_pki(cfg.security, data_dir)
    pki.ensure(serving_names(cfg))
    serving = tlsconn.TLSConfig()
    serving.certfile, serving.keyfile = str(pki.serving_cert_file), str(pki.serving_key_file)
    serving.client_ca_fallback = pki.client_ca_bundle_pem()
    codec: ValueCodec = PLAIN
    if cfg.encryption_provider_config is not None:
        # Fail closed: an invalid config or an unreachable KMS stops the start
        # (EncryptionConfigError) before the store opens.
        codec = await trio.to_thread.run_sync(load_codec, cfg.encryption_provider_config)
    async with open_store(data_dir / "fleet.db", retention=cfg.retention, sync=cfg.sync,
                          compact_interval=cfg.compact_interval, codec=codec) as store:
        registry = default_registry()
        # CustomResourceDefinitions: the stored ones' kinds are served from the first request.
        crds = crd_controller.Registrar(registry)
        await crd_controller.register_stored(store, crds)
        await ensure_default_namespaces(store, registry)
        await ensure_default_service_accounts(store, registry)
        await ensure_system_priority_classes(store, registry)
        await ensure_default_storage(store, registry)
        # kube-apiserver's rbac/bootstrap-roles hook: the default roles and bindings.
        await bootstrap_policy.reconcile(store, registry)
        # kube-apiserver's autoregistration hook: a Local APIService per served group-version.
        await apiservices.reconcile(store, registry)
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_cancel_on_signal, nursery.cancel_scope)
            namespaces = NamespaceCache()
            await nursery.start(_supervised("namespace-cache", namespaces.run, store))
            await nursery.start(_supervised("memory-trim", memory.trim_periodically))
            watches = WatchCounter()
            metrics = Metrics(store.stats, lambda: watches.open)
            dns_stats = DNSStats()
            metrics.registry.register(dns_stats)  # type: ignore[arg-type]
            host = "127.0.0.1" if cfg.address in ("0.0.0.0", "::", "") else cfg.address
            url = f"https://{host}:{cfg.port}"
            priority_classes = ClassCache()
            await nursery.start(_supervised("priority-class-cache", priority_classes.run, store))
            # LimitRanger / ResourceQuota admission: which namespaces have any (watch-fed).
            limit_ranges = NamespacedCache(limitranger.PREFIX)
            await nursery.start(_supervised("limit-range-cache", limit_ranges.run, store))
            quotas = NamespacedCache(resourcequota.PREFIX)
            await nursery.start(_supervised("resource-quota-cache", quotas.run, store))
            ingress_classes = IngressClassCache()  # DefaultIngressClass admission
            await nursery.start(_supervised("ingress-class-cache", ingress_classes.run, store))
            storage_classes = StorageClassCache()  # DefaultStorageClass, PersistentVolumeClaimResize
            await nursery.start(_supervised("storage-class-cache", storage_classes.run, store))
            sec = await security.build(cfg.security, data_dir=data_dir, store=store, registry=registry,
                                       admin_token=token, pki=pki)
            for name, task in sec.tasks:
                await nursery.start(_supervised(name, task))
            # ServiceAccount admission: accounts by namespace/name (watch-fed); the token
            # volume only when this server issues bound tokens (serviceaccounts/token).
            service_accounts = ServiceAccountCache()
            await nursery.start(_supervised("service-account-cache", service_accounts.run, store))
            # One chain for both: ResourceAPI runs it on every write; APIServer keeps
            # it for the pipeline stages it runs itself.
            # Dynamic admission webhooks: their configurations, watch-fed.
            mutating_hooks = WebhookConfigCache(MUTATING_PREFIX)
            await nursery.start(_supervised("mutating-webhook-cache", mutating_hooks.run, store))
            validating_hooks = WebhookConfigCache(VALIDATING_PREFIX)
            await nursery.start(_supervised("validating-webhook-cache", validating_hooks.run, store))
            # ValidatingAdmissionPolicy: policies, bindings and params, watch-fed.
            vap_policies, vap_bindings = policy_caches()
            await nursery.start(_supervised("admission-policy-cache", vap_policies.run, store))
            await nursery.start(_supervised("admission-policy-binding-cache", vap_bindings.run, store))
            vap_params = ParamCaches()
            await nursery.start(_supervised("admission-policy-param-caches", vap_params.run, store))
            admission = builtin_chain(store, priority_cache=priority_classes,
                                      webhooks=webhook_plugins(store, registry, mutating_hooks,
                                                               validating_hooks, namespaces, sec.authorizer),
                                      policies=ValidatingAdmissionPolicy(store, registry, vap_policies,
                                                                         vap_bindings, namespaces, vap_params,
                                                                         sec.authorizer),
                                      limit_range_cache=limit_ranges, quota_cache=quotas,
                                      ingress_class_cache=ingress_classes,
                                      storage_class_cache=storage_classes,
                                      service_account_cache=service_accounts,
                                      mount_service_account_tokens=TOKEN_REQUEST in sec.handlers,
                                      pod_security=podsecurity.load_config(cfg.security.pod_security_config)
                                      if cfg.security.pod_security_config else None,
                                      namespace_cache=namespaces,
                                      not_ready_seconds=cfg.default_not_ready_toleration_seconds,
                                      unreachable_seconds=cfg.default_unreachable_toleration_seconds)
            rest = ResourceAPI(store, registry, admission, namespaces)
            # Services' ClusterIPs and NodePorts: the allocation strategy of the write
            # path, its caches, the default ServiceCIDR and the `kubernetes` Service.
            allocator = ServiceAllocator(store, ServiceIPRange(cfg.service_cidr),
                                         PortRange.parse(cfg.service_node_port_range))
            await nursery.start(_supervised("service-allocator", allocator.run, store))
            rest.allocators[("", "services")] = allocator
            rest.delete_strategies[("apiextensions.k8s.io", "customresourcedefinitions")] = \
                crd_controller.delete_strategy(rest)
            # System Services (`default/kubernetes`, `kube-system/kube-dns`): ensured now
            # and again at every pass of the repair loop.
            system_services = [partial(systemsvc.ensure_default_service_cidr, store, registry,
                                       allocator.ip_range.cidr),
                               partial(systemsvc.ensure_kubernetes_service, store, registry, allocator,
                                       advertise_address=cfg.advertise_address
                                       or systemsvc.default_advertise_address(cfg.address),
                                       port=cfg.port)]
            # kube-dns: ClusterIP --cluster-dns → the DNS listener's port at the advertised
            # address.
            if cfg.dns.bind:
                system_services.append(partial(systemsvc.ensure_system_service, store, registry,
                                               allocator, **kube_dns_spec(
                                                   cfg.dns, server_address=cfg.advertise_address
                                                   or cfg.address)))
            await systemsvc.ensure_all(system_services)
            # The TokenRequest handler runs the chain built above (NodeRestriction sees it).
            sec.set_admission(admission)
            # Security's validating plugins (RBAC escalation prevention) run first.
            admission.validating[:0] = sec.validating_admission
            # kube-public/cluster-info: the server URL and CA a joining node discovers
            # with its bootstrap token (signed per token by the bootstrap signer).
            advertised = cfg.advertise_address or systemsvc.default_advertise_address(cfg.address)
            advertised = f"[{advertised}]" if ":" in advertised else advertised
            await bootstrap.ensure_cluster_info(store, registry, f"https://{advertised}:{cfg.port}",
                                                pki.server_ca_bundle_pem())
            # The client CA bundles, as kube-apiserver publishes them: joined nodes'
            # agent APIs verify this server's client certificate with them.
            await bootstrap.ensure_configmap(store, registry, bootstrap.CLIENT_CA_NAMESPACE,
                                             bootstrap.CLIENT_CA_NAME, {
                                                 bootstrap.CLIENT_CA_KEY: pki.client_ca_bundle_pem().decode(),
                                                 bootstrap.REQUESTHEADER_CA_KEY:
                                                     pki.requestheader_ca_bundle_pem().decode()})
            assert sec.certs is not None
            certs: CertRotator = sec.certs
            # The server's client certificate for the agents' HTTPS API (kube-apiserver's
            # --kubelet-client-certificate), trusting agents' server-CA certificates.
            kubelet_client = certs.client_tls("apiserver-kubelet-client", KUBELET_CLIENT_USER,
                                              [MASTERS])
            api = APIServer(store, registry, sec.authenticator, sec.authorizer, admission,
                            rest, metrics, watches, f"{host}:{cfg.port}", agent_token=token,
                            anonymous=cfg.security.anonymous, audit=sec.audit,
                            process_control_consent=cfg.security.process_control_consent,
                            agent_tls=kubelet_client.ctx)
            api.resource_handlers.update(sec.handlers)
            api.path_handlers.update(sec.paths)
            # Server-side drains (nodes/{name}/drain): resumes the ones a restart interrupted.
            await nursery.start(_supervised("maintenance", api.maintenance.run))
            # metrics.k8s.io: scrape the agents every metric_resolution seconds.
            api.resource_metrics.resolution = cfg.metric_resolution
            await nursery.start(_supervised("resource-metrics", api.resource_metrics.run))
            timeouts = limits.ClientTimeouts(cfg.keep_alive_timeout, cfg.tls_handshake_timeout,
                                             cfg.request_body_timeout)
            await nursery.start(partial(_serve, create_app(api, body_timeout=cfg.request_body_timeout),
                                        cfg.address, cfg.port, serving, timeouts=timeouts))
            await nursery.start(partial(_serve, _metrics_app(metrics), cfg.address, cfg.metrics_port,
                                        timeouts=timeouts))
            kubeconfig = data_dir / "admin.kubeconfig"
            write_admin_kubeconfig(kubeconfig, url, token, pki)

            def certificates_changed() -> None:
                # A renewed serving certificate for new connections; the admin
                # kubeconfig with the renewed admin certificate and the CA bundle.
                serving.reload(str(pki.serving_cert_file), str(pki.serving_key_file))
                write_admin_kubeconfig(kubeconfig, url, token, pki)

            certs.on_change(certificates_changed)
            ca_pem = pki.server_ca_bundle_pem()
            task_status.started(ServerInfo(url, kubeconfig, token, f"http://{host}:{cfg.metrics_port}/metrics",
                                           ca_pem))
            # The scheduler, controllers and the built-in agent are clients of the
            # API like any other (the agent takes exactly the path a remote node
            # does).  They start after `started`, so a SIGTERM during their
            # start-up cannot look like a failed server start.
            # Each runs as its own user, with a client certificate the rotation renews.
            client_cfg = ClientConfig(server=url, token=token, ca_data=ca_pem)

            def identity(user: str, groups: tuple[str, ...] = ()) -> ClientConfig:
                return component_client_config(pki, url, user, groups, certs)

            # The CRD controller: names, Established, the live registry, the cleanup finalizer.
            nursery.start_soon(_supervised("crd-controller", Manager([crd_controller.CRDController(crds)]).run,
                                           client_cfg))
            nursery.start_soon(_supervised("service-allocation-repair", svcrepair.run_repair, store, allocator,
                                           client_cfg, cfg.service_repair_interval, system_services))
            if cfg.scheduler:
                nursery.start_soon(_supervised("scheduler", scheduler.run, identity(KUBE_SCHEDULER_USER)))
            # Node IPAM and node lifecycle are controllers of the manager, like the others.
            nursery.start_soon(_supervised("controller-manager", _run_controllers, cfg,
                                           identity(KUBE_CONTROLLER_MANAGER_USER), pki))
            if cfg.dns.bind:
                nursery.start_soon(_supervised("cluster-dns", run_cluster_dns, cfg.dns,
                                               identity(CLUSTER_DNS_USER), dns_stats))
            if cfg.ingress.active:
                ingress_cfg = replace(cfg.ingress, data_dir=cfg.ingress.data_dir or data_dir,
                                      server_address=cfg.ingress.server_address
                                      or cfg.advertise_address or cfg.address)
                nursery.start_soon(_supervised("ingress", run_ingress, ingress_cfg, identity(INGRESS_USER)))
            if cfg.agent:
                # The built-in agent is node system:node:<name> (group system:nodes); its
                # API serves a certificate the server issues from its CA directly.
                from fleet.agent.config import AgentConfig

                node_name = AgentConfig().node_name
                node_client = identity(NODE_USER_PREFIX + node_name, (NODES_GROUP,))
                nursery.start_soon(_supervised("agent", _run_agent, cfg, url, node_name, node_client,
                                               PKIServingSource(pki, node_name), certs.interval,
                                               identity(STORAGE_PROVISIONER_USER)))


def _supervised(name: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Callable[..., Awaitable[None]]:
    """`fn(*args)` as a supervised component (fleet._core.supervise), ready for
    `nursery.start` / `start_soon`: an exception in it is logged, counted and the
    component restarted with back-off, never the end of the server.  Only the store
    (the outermost nursery) and the API listeners are not supervised: if those fail
    there is no server left to keep."""
    return partial(supervise, name, partial(fn, *args))


async def _run_controllers(cfg: ServerConfig, client_cfg: ClientConfig, pki: ClusterPKI, *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    # A fresh manager per (re)start: controllers keep caches, expectations and
    # queues wired to the informers of the run that failed, and a restart should
    # begin from a clean list, as a restarted kube-controller-manager does.
    # The storage provisioner of the drivers that are not node_local (fleet.storage.provisioner):
    # a controller of the manager, sharing its claim/volume informers, leader-only with it.
    provisioner = server_provisioner(Path(cfg.data_dir))
    manager = default_manager(
        cfg.controllers, extra=[provisioner] if provisioner is not None else [],
        hpa_sync_period=cfg.hpa_sync_period,
        max_endpoints_per_slice=cfg.max_endpoints_per_slice,
        # csrsigning signs with the cluster PKI (client CA for client signers, server CA
        # for kubelet-serving).
        csr_signer=pki,
        node_ipam=NodeIPAMConfig(cluster_cidr=cfg.cluster_cidr),
        # kube-root-ca.crt in every namespace: the server CA bundle as the PKI keeps it.
        root_ca=RootCAPublisherConfig(ca_bundle=pki.server_ca_bundle_pem),
        node_lifecycle=NodeLifecycleConfig(
            monitor_grace_period=cfg.node_monitor_grace_period,
            startup_grace_period=cfg.node_startup_grace_period,
            monitor_period=cfg.node_monitor_period, eviction_rate=cfg.node_eviction_rate,
            secondary_eviction_rate=cfg.secondary_node_eviction_rate,
            unhealthy_zone_threshold=cfg.unhealthy_zone_threshold,
            large_cluster_size_threshold=cfg.large_cluster_size_threshold))
    await manager.run(client_cfg, task_status=task_status)


def server_ca_bundle(data_dir: Path, fallback: bytes | None = None) -> bytes:
    """The CA bundle that verifies this server: `<data-dir>/tls/ca.crt` (during a CA
    rotation it holds the old and the new CA), else `fallback` (the client's ca_data).
    Blocking: the root CA publisher calls it in a worker thread."""
    path = Path(data_dir) / "tls" / "ca.crt"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return fallback or b""


def serving_names(cfg: ServerConfig) -> list[str]:
    """The serving certificate's names beyond localhost: the listen and advertised
    addresses, and the `kubernetes` Service as pods reach it (its ClusterIP and
    `kubernetes.default.svc.<domain>`), so in-cluster clients verify the server."""
    names = [cfg.address, cfg.advertise_address or systemsvc.default_advertise_address(cfg.address)]
    with contextlib.suppress(ValueError):
        names.append(ServiceIPRange(cfg.service_cidr).kubernetes_ip)
    names += ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
              f"kubernetes.default.svc.{cfg.dns.domain}"]
    return names


async def _run_agent(cfg: ServerConfig, url: str, node_name: str, client: ClientConfig,
                     serving: PKIServingSource | None = None, check_interval: float = 30.0,
                     storage_client: ClientConfig | None = None, *,
                     task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    from fleet.agent.config import AgentConfig
    from fleet.agent.run import run as run_agent

    agent_cfg = AgentConfig(server_url=url, ca_data=client.ca_data, node_name=node_name,
                            client_ssl_context=client.ssl_context, serving_source=serving,
                            tls_check_interval=check_interval, storage_client=storage_client,
                            data_dir=Path(cfg.data_dir) / "agent", port=cfg.agent_port,
                            driver=cfg.agent_driver, network_driver=cfg.agent_network,
                            bridge_name=cfg.agent_bridge, registries=cfg.agent_registries,
                            network_policy_strict=cfg.agent_network_policy_strict,
                            storage_plugins=list(cfg.storage_plugins),
                            cluster_cidr=cfg.cluster_cidr, service_cidr=cfg.service_cidr,
                            cluster_dns=[cfg.dns.service_ip], cluster_domain=cfg.dns.domain,
                            resolv_conf=cfg.dns.resolv_conf,
                            # The built-in agent's port drops slow clients as the API does.
                            keep_alive_timeout=cfg.keep_alive_timeout,
                            request_body_timeout=cfg.request_body_timeout,
                            # A server that only listens on loopback gets a node that does too.
                            address="127.0.0.1" if cfg.address in ("127.0.0.1", "localhost", "::1") else "")
    await run_agent(agent_cfg, task_status=task_status)


async def _cancel_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return
