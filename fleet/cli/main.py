"""`fleet`: every role of Fleet by subcommand (server, scheduler, agent, killall, shim,
token).

`fleet ctl ...` is the same CLI as `kfleet`.
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import cyclopts
import trio

from fleet import __version__

if TYPE_CHECKING:
    from fleet.agent.config import AgentConfig
    from fleet.runtime.images.mirrors import RegistriesConfig
    from fleet.server.security import SecurityConfig

app = cyclopts.App(name="fleet", help="Fleet: a Kubernetes-class orchestrator in one program.",
                   version=__version__)


@app.command
def server(
    *,
    data_dir: Annotated[Path | None, cyclopts.Parameter(help="State directory (default /var/lib/fleet as root, "
                                                             "else ~/.local/share/fleet).")] = None,
    port: Annotated[int, cyclopts.Parameter(help="API port.")] = 9300,
    metrics_port: Annotated[int, cyclopts.Parameter(help="Prometheus metrics port.")] = 9302,
    address: Annotated[str, cyclopts.Parameter(help="Address to listen on.")] = "127.0.0.1",
    retention: Annotated[int, cyclopts.Parameter(help="Revisions of history kept for watches.")] = 10000,
    compaction_interval: Annotated[float, cyclopts.Parameter(
        help="Seconds between two compactions of the history beyond --retention (kube-apiserver's "
             "--etcd-compaction-interval); 0 never compacts.")] = 60.0,
    cluster_cidr: Annotated[str, cyclopts.Parameter(help="Pod address range; each node gets a /24.")] = "10.42.0.0/16",
    service_cidr: Annotated[str, cyclopts.Parameter(
        help="Service ClusterIP range; the first address is the `kubernetes` Service's.")] = "10.43.0.0/16",
    service_node_port_range: Annotated[str, cyclopts.Parameter(
        help="NodePort range of NodePort and LoadBalancer Services.")] = "30000-32767",
    service_repair_interval: Annotated[float, cyclopts.Parameter(
        help="Seconds between two passes of the ClusterIP/NodePort repair loop.")] = 60.0,
    advertise_address: Annotated[str | None, cyclopts.Parameter(
        help="Address the `kubernetes` Service's Endpoints point at (default: the listen "
             "address; when listening on all, the default-route interface's address).")] = None,
    no_agent: Annotated[bool, cyclopts.Parameter(help="Do not run the built-in node agent.", negative=())] = False,
    no_scheduler: Annotated[bool, cyclopts.Parameter(
        help="Do not run the built-in scheduler (run `fleet scheduler` elsewhere).", negative=())] = False,
    controllers: Annotated[str | None, cyclopts.Parameter(
        help="Controllers to run, comma-separated: `*` for all (default), `-name` to leave one "
             "out, e.g. '*,-garbagecollector'.")] = None,
    agent_port: Annotated[int, cyclopts.Parameter(help="Port of the built-in agent's API.")] = 9301,
    agent_driver: Annotated[str, cyclopts.Parameter(help="Runtime driver of the built-in agent: auto, oci or process.")] = "auto",
    agent_network: Annotated[str | None, cyclopts.Parameter(
        help="Pod network of the built-in agent: bridge or none (default: bridge as root, else none).")] = None,
    agent_bridge: Annotated[str | None, cyclopts.Parameter(help="Bridge name of the built-in agent (default fleet0).")] = None,
    network_policy_strict: Annotated[bool, cyclopts.Parameter(
        help="The built-in agent fails closed on NetworkPolicy: a pod whose rules cannot be "
             "programmed gets no traffic at all (default: it keeps its previous rules).",
        negative=())] = False,
    registries: Annotated[Path | None, cyclopts.Parameter(
        help="Registry mirrors, rewrites, auth and TLS of the built-in agent (k3s' registries.yaml "
             "format; default DATA_DIR/registries.yaml if present).")] = None,
    disable_default_registry_endpoint: Annotated[bool, cyclopts.Parameter(
        help="The built-in agent pulls images of mirrored registries only from their mirrors.",
        negative=())] = False,
    node_monitor_grace_period: Annotated[float, cyclopts.Parameter(
        help="Seconds without a node heartbeat before the node is Unknown and unreachable.")] = 40.0,
    node_startup_grace_period: Annotated[float, cyclopts.Parameter(
        help="The same for a node that never posted Ready.")] = 60.0,
    node_monitor_period: Annotated[float, cyclopts.Parameter(
        help="Longest interval between two node health passes.")] = 5.0,
    node_eviction_rate: Annotated[float, cyclopts.Parameter(
        help="Nodes per second (per zone) that may get the NoExecute taint.")] = 0.1,
    secondary_node_eviction_rate: Annotated[float, cyclopts.Parameter(
        help="That rate in a large, partially disrupted zone.")] = 0.01,
    unhealthy_zone_threshold: Annotated[float, cyclopts.Parameter(
        help="Fraction of not-Ready nodes that makes a zone partially disrupted.")] = 0.55,
    large_cluster_size_threshold: Annotated[int, cyclopts.Parameter(
        help="Zones larger than this keep tainting (slowly) when partially disrupted.")] = 50,
    metric_resolution: Annotated[float, cyclopts.Parameter(
        help="Seconds between two scrapes of the agents for the resource metrics API "
             "(kubectl top, the HPA).")] = 15.0,
    hpa_sync_period: Annotated[float, cyclopts.Parameter(
        help="Seconds between two syncs of each HorizontalPodAutoscaler.")] = 15.0,
    max_endpoints_per_slice: Annotated[int, cyclopts.Parameter(
        help="Most endpoints the EndpointSlice controller puts in one slice (1-1000).")] = 100,
    keep_alive_timeout: Annotated[float, cyclopts.Parameter(
        help="Seconds a connection may stay idle, or take to send a request's line and headers.")] = 32.0,
    tls_handshake_timeout: Annotated[float, cyclopts.Parameter(
        help="Seconds a client may take to complete the TLS handshake.")] = 32.0,
    request_body_timeout: Annotated[float, cyclopts.Parameter(
        help="Seconds a request body may take to arrive in full (then 408).")] = 60.0,
    cluster_dns_bind: Annotated[str, cyclopts.Parameter(
        help="host:port of the cluster DNS listeners (UDP and TCP); '' turns cluster DNS off.")] = "0.0.0.0:10053",
    cluster_domain: Annotated[str, cyclopts.Parameter(help="The cluster DNS domain.")] = "cluster.local",
    cluster_dns: Annotated[str, cyclopts.Parameter(
        help="ClusterIP of the kube-system/kube-dns Service.")] = "10.43.0.10",
    cluster_dns_ttl: Annotated[int, cyclopts.Parameter(
        help="TTL (seconds) of cluster DNS records and of their negative answers.")] = 5,
    cluster_dns_advertise: Annotated[str, cyclopts.Parameter(
        help="Address written into kube-dns' Endpoints (default: the bind host; for a wildcard "
             "bind --address unless loopback, else the default-route interface's address).")] = "",
    dns_upstream: Annotated[list[str] | None, cyclopts.Parameter(
        help="Upstream resolver ip[:port] for names outside the cluster domain (repeatable; "
             "default: the nameservers of --resolv-conf).")] = None,
    resolv_conf: Annotated[str, cyclopts.Parameter(
        help="resolv.conf whose nameservers are the default upstreams.")] = "/etc/resolv.conf",
    cluster_dns_pods: Annotated[str, cyclopts.Parameter(
        help="Pod records a-b-c-d.<ns>.pod.<domain>: insecure (any IP, CoreDNS's `pods insecure`), "
             "verified (a pod of that namespace has the IP) or disabled.")] = "insecure",
    cluster_dns_allow: Annotated[str | None, cyclopts.Parameter(
        help="Source networks (comma-separated CIDRs, '*' for all) whose DNS queries are answered "
             "(default: loopback and the private ranges).")] = None,
    ingress_bind: Annotated[str, cyclopts.Parameter(
        help="Address the ingress (Ingress and Gateway API) listens on.")] = "0.0.0.0",
    ingress_http_port: Annotated[int, cyclopts.Parameter(
        help="The ingress' HTTP port (0: none).")] = 8080,
    ingress_https_port: Annotated[int, cyclopts.Parameter(
        help="The ingress' HTTPS port (0: none).")] = 8443,
    ingress_engine: Annotated[str, cyclopts.Parameter(
        help="The ingress data plane: builtin (Fleet's own proxy) or nginx.")] = "builtin",
    ingress_advertise: Annotated[str, cyclopts.Parameter(
        help="Addresses (comma-separated) written into Ingress and Gateway status (default: the "
             "bind host; for a wildcard bind --address unless loopback, else the default-route "
             "interface's address).")] = "",
    no_ingress: Annotated[bool, cyclopts.Parameter(
        help="Do not run the ingress (Ingress and Gateway API).", negative=())] = False,
    storage_plugin: Annotated[list[str] | None, cyclopts.Parameter(
        help="Python module (or module:function) that registers a storage driver with "
             "fleet.storage.registry (repeatable); also loaded by the built-in agent.")] = None,
    anonymous_auth: Annotated[bool, cyclopts.Parameter(
        help="Requests without credentials are system:anonymous (authorization decides; RBAC's "
             "defaults let them read only /healthz, /livez, /readyz and /version) instead of 401.",
        negative=())] = False,
    authorization_mode: Annotated[str, cyclopts.Parameter(
        help="Authorizers in order, comma-separated: Node, RBAC; or AlwaysAllow alone "
             "(development only: every authenticated request is allowed).")] = "Node,RBAC",
    service_account_issuer: Annotated[list[str] | None, cyclopts.Parameter(
        help="Issuer (iss) of ServiceAccount tokens (repeatable: the first issues, all are "
             "accepted; default https://kubernetes.default.svc.cluster.local).")] = None,
    api_audiences: Annotated[list[str] | None, cyclopts.Parameter(
        help="Audiences a token must be meant for to reach the API (repeatable or "
             "comma-separated; default: the issuer).")] = None,
    service_account_signing_key_file: Annotated[Path | None, cyclopts.Parameter(
        help="PEM private key (RSA or EC) ServiceAccount tokens are signed with "
             "(default DATA_DIR/tls/sa.key, made at first start).")] = None,
    service_account_key_file: Annotated[list[Path] | None, cyclopts.Parameter(
        help="PEM public keys that also verify ServiceAccount tokens (repeatable).")] = None,
    service_account_max_token_expiration: Annotated[int, cyclopts.Parameter(
        help="Longest validity (seconds) of a requested ServiceAccount token; longer "
             "requests are shortened (0: no maximum).")] = 0,
    service_account_extend_token_expiration: Annotated[bool, cyclopts.Parameter(
        help="Pod-bound tokens asking for 3607 s stay valid a year, with a warnafter claim.")] = True,
    service_account_jwks_uri: Annotated[str, cyclopts.Parameter(
        help="jwks_uri of the issuer's discovery document (default ISSUER/openid/v1/jwks).")] = "",
    oidc_issuer_url: Annotated[str, cyclopts.Parameter(
        help="https URL of an OpenID Connect provider whose ID tokens authenticate users.")] = "",
    oidc_client_id: Annotated[str, cyclopts.Parameter(
        help="Client ID ID tokens must be issued for (their aud).")] = "",
    oidc_username_claim: Annotated[str, cyclopts.Parameter(
        help="Claim used as the user name.")] = "sub",
    oidc_username_prefix: Annotated[str | None, cyclopts.Parameter(
        help="Prefix of OIDC user names ('-': none; default ISSUER# unless the claim is email).")] = None,
    oidc_groups_claim: Annotated[str, cyclopts.Parameter(
        help="Claim (string or list of strings) with the user's groups.")] = "",
    oidc_groups_prefix: Annotated[str, cyclopts.Parameter(help="Prefix of OIDC group names.")] = "",
    oidc_ca_file: Annotated[str, cyclopts.Parameter(
        help="CA bundle that verifies the OIDC provider (default: the system roots).")] = "",
    oidc_required_claim: Annotated[list[str] | None, cyclopts.Parameter(
        help="key=value a claim of every ID token must have (repeatable).")] = None,
    oidc_signing_algs: Annotated[str, cyclopts.Parameter(
        help="Signing algorithms ID tokens may use, comma-separated.")] = "RS256",
    audit_log_path: Annotated[str, cyclopts.Parameter(
        help="Write the audit log (audit.k8s.io/v1 Events, one JSON line each) to this file; "
             "'-' is standard output. Unset: no audit log.")] = "",
    audit_policy_file: Annotated[str, cyclopts.Parameter(
        help="The audit policy (audit.k8s.io/v1 Policy, YAML or JSON). Unset: every request at "
             "the Metadata level. Secrets are never logged beyond Metadata.")] = "",
    encryption_provider_config: Annotated[Path | None, cyclopts.Parameter(
        help="EncryptionConfiguration (apiserver.config.k8s.io/v1) naming the resources stored "
             "encrypted and their providers (identity, aesgcm, kms v2); see `fleet secrets rotate`.")] = None,
    audit_log_maxsize: Annotated[int, cyclopts.Parameter(
        help="Rotate the audit log when it would grow past this many megabytes (0: 100).")] = 0,
    audit_log_maxage: Annotated[int, cyclopts.Parameter(
        help="Remove rotated audit logs older than this many days (0: keep them).")] = 0,
    audit_log_maxbackup: Annotated[int, cyclopts.Parameter(
        help="Keep at most this many rotated audit logs (0: keep all).")] = 0,
    pod_security_config: Annotated[str, cyclopts.Parameter(
        help="PodSecurity admission's configuration (pod-security.admission.config.k8s.io/v1 "
             "PodSecurityConfiguration, YAML or JSON: default levels for namespaces without "
             "pod-security.kubernetes.io/* labels, exempt usernames, runtimeClasses and namespaces). "
             "Unset: privileged by default, no exemptions.")] = "",
    cert_lifetime: Annotated[float | None, cyclopts.Parameter(
        show=False, help="Leaf certificate lifetime in seconds (tests).")] = None,
    hardened: Annotated[bool, cyclopts.Parameter(
        help="Production hardening: turns on the ProcessControl consent gate (exec, attach, "
             "port-forward and signal need a fleet.dev/v1 ProcessControl in the pod's namespace "
             "besides RBAC).", negative=())] = False,
    process_control_consent: Annotated[bool, cyclopts.Parameter(
        help="Require a ProcessControl's consent for exec, attach, port-forward and signal "
             "(also on with --hardened; off by default: RBAC alone decides).", negative=())] = False,
    log_level: str = "INFO",
) -> None:
    """Run the control plane: API server, store, scheduler, controllers, metrics, and a node agent."""
    from fleet.server.run import ServerConfig, ServerInfo, default_data_dir, run
    from fleet.store import StoreCorrupt
    from fleet.store.encryption import EncryptionConfigError

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = ServerConfig(data_dir=data_dir or default_data_dir(), port=port, metrics_port=metrics_port,
                       address=address, retention=retention, compact_interval=compaction_interval,
                       cluster_cidr=cluster_cidr,
                       agent=not no_agent, agent_port=agent_port, agent_driver=agent_driver,
                       agent_bridge=agent_bridge, agent_network_policy_strict=network_policy_strict,
                       storage_plugins=list(storage_plugin or []))
    if agent_network is not None:
        cfg.agent_network = None if agent_network in ("none", "host", "") else agent_network
    if not no_agent:
        cfg.agent_registries = _registries(registries, Path(cfg.data_dir),
                                           disable_default_registry_endpoint, "fleet server")
    cfg.scheduler = not no_scheduler
    from fleet.server.security import parse_authorization_mode

    try:
        parse_authorization_mode(authorization_mode)
    except ValueError as e:
        sys.exit(f"fleet server: {e}")
    cfg.security.anonymous, cfg.security.authorization_mode = anonymous_auth, authorization_mode
    _token_flags(cfg.security, service_account_issuer, api_audiences, service_account_signing_key_file,
                 service_account_key_file, service_account_max_token_expiration,
                 service_account_extend_token_expiration, service_account_jwks_uri)
    if oidc_issuer_url:
        from fleet.auth.oidc import OIDCConfig, parse_required_claims

        try:
            oidc = OIDCConfig(issuer_url=oidc_issuer_url, client_id=oidc_client_id,
                              username_claim=oidc_username_claim, username_prefix=oidc_username_prefix,
                              groups_claim=oidc_groups_claim, groups_prefix=oidc_groups_prefix,
                              ca_file=oidc_ca_file,
                              required_claims=parse_required_claims(oidc_required_claim or []),
                              signing_algs=tuple(a.strip() for a in oidc_signing_algs.split(",") if a.strip()))
        except ValueError as e:
            sys.exit(f"fleet server: {e}")
        if problems := oidc.validate():
            sys.exit("fleet server: " + "; ".join(problems))
        cfg.security.oidc = oidc
    from fleet.auth.audit import PolicyError, check_log_path, load_policy

    if min(audit_log_maxsize, audit_log_maxage, audit_log_maxbackup) < 0:
        sys.exit("fleet server: --audit-log-maxsize, --audit-log-maxage and --audit-log-maxbackup "
                 "must not be negative")
    try:
        if audit_policy_file:
            load_policy(audit_policy_file)
    except PolicyError as e:
        sys.exit(f"fleet server: --audit-policy-file: {e}")
    try:
        check_log_path(audit_log_path)
    except OSError as e:
        sys.exit(f"fleet server: --audit-log-path: {e}")
    cfg.security.audit_log_path, cfg.security.audit_policy_file = audit_log_path, audit_policy_file
    cfg.security.audit_log_maxsize, cfg.security.audit_log_maxage = audit_log_maxsize, audit_log_maxage
    cfg.security.audit_log_maxbackup = audit_log_maxbackup
    cfg.security.cert_lifetime = cert_lifetime
    if pod_security_config:
        from fleet.admission.podsecurity import ConfigError, load_config

        try:
            load_config(pod_security_config)
        except ConfigError as e:
            sys.exit(f"fleet server: --pod-security-config: {e}")
    cfg.security.pod_security_config = pod_security_config
    cfg.security.process_control_consent = hardened or process_control_consent
    if encryption_provider_config is not None:
        from fleet.store.encryption import load_config

        try:
            load_config(encryption_provider_config)  # validated now; the KMS is asked at start
        except EncryptionConfigError as e:
            sys.exit(f"fleet server: --encryption-provider-config: {e}")
        cfg.encryption_provider_config = encryption_provider_config
    if controllers:
        from fleet.controllers.manager import default_controllers, select

        cfg.controllers = [c for c in controllers.split(",") if c.strip()]
        try:
            select(default_controllers(), cfg.controllers)
        except ValueError as e:
            sys.exit(f"fleet server: --controllers: {e}")
    from fleet.server.svcalloc_range import PortRange, ServiceIPRange

    try:
        ServiceIPRange(service_cidr)
        PortRange.parse(service_node_port_range)
    except ValueError as e:
        sys.exit(f"fleet server: {e}")
    cfg.service_cidr, cfg.service_node_port_range = service_cidr, service_node_port_range
    cfg.service_repair_interval, cfg.advertise_address = service_repair_interval, advertise_address
    cfg.node_monitor_grace_period = node_monitor_grace_period
    cfg.node_startup_grace_period = node_startup_grace_period
    cfg.node_monitor_period = node_monitor_period
    cfg.node_eviction_rate = node_eviction_rate
    cfg.secondary_node_eviction_rate = secondary_node_eviction_rate
    cfg.unhealthy_zone_threshold = unhealthy_zone_threshold
    cfg.large_cluster_size_threshold = large_cluster_size_threshold
    cfg.metric_resolution = metric_resolution
    cfg.hpa_sync_period = hpa_sync_period
    if not 1 <= max_endpoints_per_slice <= 1000:
        sys.exit("fleet server: --max-endpoints-per-slice must be between 1 and 1000")
    cfg.max_endpoints_per_slice = max_endpoints_per_slice
    cfg.keep_alive_timeout = keep_alive_timeout
    cfg.tls_handshake_timeout = tls_handshake_timeout
    cfg.request_body_timeout = request_body_timeout
    cfg.dns.bind, cfg.dns.domain, cfg.dns.service_ip = cluster_dns_bind, cluster_domain, cluster_dns
    cfg.dns.advertise, cfg.dns.resolv_conf = cluster_dns_advertise, resolv_conf
    cfg.dns.ttl, cfg.dns.pod_records = cluster_dns_ttl, cluster_dns_pods
    cfg.dns.upstreams = [u for arg in dns_upstream or [] for u in arg.split(",") if u.strip()]
    if cluster_dns_allow is not None:
        cfg.dns.allow = [n.strip() for n in cluster_dns_allow.split(",") if n.strip()]
    try:
        cfg.dns.validate()
    except ValueError as e:
        sys.exit(f"fleet server: cluster DNS: {e}")
    cfg.ingress.enabled = not no_ingress
    cfg.ingress.bind_address, cfg.ingress.engine = ingress_bind, ingress_engine
    cfg.ingress.http_port, cfg.ingress.https_port = ingress_http_port, ingress_https_port
    cfg.ingress.advertise = [a.strip() for a in ingress_advertise.split(",") if a.strip()]
    try:
        cfg.ingress.validate()
    except ValueError as e:
        sys.exit(f"fleet server: ingress: {e}")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        async with trio.open_nursery() as n:
            info: ServerInfo = await n.start(lambda task_status: run(cfg, task_status=task_status,
                                                                     handle_signals=True))
            print(f"Fleet API server listening on {info.url}", flush=True)
            print(f"Metrics on {info.metrics_url}", flush=True)
            print(f"Wrote kubeconfig to {info.kubeconfig}", flush=True)
            print(f"Use it: export KUBECONFIG={info.kubeconfig}", flush=True)

    try:
        trio.run(main)
    except* (StoreCorrupt, OSError, EncryptionConfigError) as group:
        # Start-up failures (a foreign or damaged database, a port in use) end the
        # process with one clear line instead of a traceback.
        for e in _leaves(group):
            print(f"fleet server: error: {e}", file=sys.stderr)
        sys.exit(1)
    except* KeyboardInterrupt:
        pass


@app.command
def scheduler(
    *,
    kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Read server, token and CA from here.")] = None,
    server: Annotated[str | None, cyclopts.Parameter(help="API server URL.")] = None,
    token: Annotated[str | None, cyclopts.Parameter(help="Bearer token.")] = None,
    ca_file: Annotated[str | None, cyclopts.Parameter(help="CA bundle to trust the server with.")] = None,
    percentage_of_nodes_to_score: Annotated[int, cyclopts.Parameter(
        help="Share of feasible nodes to find before scoring (0: Kubernetes' adaptive default).")] = 0,
    log_level: str = "INFO",
) -> None:
    """Run the scheduler on its own, against any Fleet API (as kube-scheduler runs).

    `fleet server` runs the same scheduler in-process unless --no-scheduler."""
    from fleet.client import ClientConfig, load_kubeconfig
    from fleet.scheduler import SchedulerConfig
    from fleet.scheduler import run as run_scheduler

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if kubeconfig:
        cfg = load_kubeconfig(kubeconfig)
    else:
        if not server:
            sys.exit("fleet scheduler: --kubeconfig or --server is required")
        ca = Path(ca_file).read_bytes() if ca_file else None
        cfg = ClientConfig(server=server, token=token, ca_data=ca)
    from fleet._core.supervise import supervise

    # Supervised, as inside `fleet server`: after it has started once, a crash
    # restarts the scheduler in-process with back-off instead of ending it.
    try:
        trio.run(partial(supervise, "scheduler", partial(run_scheduler, cfg, SchedulerConfig(
            percentage_of_nodes_to_score=percentage_of_nodes_to_score)), retry_start=False))
    except* KeyboardInterrupt:
        pass


@app.command
def agent(
    *,
    server: Annotated[str | None, cyclopts.Parameter(help="API server URL.")] = None,
    token: Annotated[str | None, cyclopts.Parameter(
        help="A join token from `fleet token create` (<6>.<16>: the node joins and gets its own "
             "certificate), or a bearer token.")] = None,
    ca_cert_hash: Annotated[list[str] | None, cyclopts.Parameter(
        help="Joining: the cluster CA's public key hash (sha256:<hex>) to accept (repeatable).")] = None,
    ca_file: Annotated[str | None, cyclopts.Parameter(help="CA bundle to trust the server with.")] = None,
    kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Read server, token and CA from here.")] = None,
    insecure: bool = False,
    tls_cert_file: Annotated[str | None, cyclopts.Parameter(
        help="The agent API's serving certificate (from the cluster's server CA).")] = None,
    tls_private_key_file: Annotated[str | None, cyclopts.Parameter(
        help="Its key.")] = None,
    client_ca_file: Annotated[str | None, cyclopts.Parameter(
        help="CA bundle whose client certificates may call the agent API (the cluster's client CA).")] = None,
    data_dir: Annotated[Path, cyclopts.Parameter(help="Agent state directory.")] = Path("/var/lib/fleet-agent"),
    node_name: Annotated[str | None, cyclopts.Parameter(help="Node name (default: host name).")] = None,
    port: Annotated[int, cyclopts.Parameter(help="Agent API port.")] = 9301,
    address: Annotated[str, cyclopts.Parameter(help="Node address (default: first non-loopback IPv4).")] = "",
    driver: Annotated[str, cyclopts.Parameter(help="Runtime driver: auto, oci or process.")] = "auto",
    network: Annotated[str, cyclopts.Parameter(help="Pod network driver: bridge, or none.")] = "bridge",
    pod_cidr: Annotated[str | None, cyclopts.Parameter(help="This node's pod CIDR if the server assigns none.")] = None,
    bridge_name: str | None = None,
    network_backend: Annotated[str, cyclopts.Parameter(
        help="Routes to other nodes' pods: auto (host-gw to peers on a directly connected "
             "subnet, VXLAN to the others), host-gw or vxlan.")] = "auto",
    cluster_cidr: Annotated[str, cyclopts.Parameter(
        help="The whole cluster's pod range (the server's --cluster-cidr): not masqueraded.")] = "10.42.0.0/16",
    service_cidr: Annotated[str, cyclopts.Parameter(
        help="The Service ClusterIP range (the server's --service-cidr).")] = "10.43.0.0/16",
    service_proxy: Annotated[bool, cyclopts.Parameter(
        help="Program the node's Service rules (nftables); --no-service-proxy leaves them to "
             "another proxy.")] = True,
    network_policy_strict: Annotated[bool, cyclopts.Parameter(
        help="Fail closed on NetworkPolicy: a pod whose rules cannot be programmed gets no "
             "traffic at all (default: it keeps its previous rules, or none).",
        negative=())] = False,
    insecure_registry: Annotated[list[str] | None, cyclopts.Parameter(help="Registry reachable over plain HTTP.")] = None,
    registries: Annotated[Path | None, cyclopts.Parameter(
        help="Registry mirrors, rewrites, auth and TLS (k3s' registries.yaml format; "
             "default DATA_DIR/registries.yaml if present).")] = None,
    disable_default_registry_endpoint: Annotated[bool, cyclopts.Parameter(
        help="Pull images of mirrored registries only from their mirrors, never the registry itself.",
        negative=())] = False,
    lease_interval: Annotated[float | None, cyclopts.Parameter(
        help="Seconds between node Lease renewals (default 10).")] = None,
    node_status_interval: Annotated[float | None, cyclopts.Parameter(
        help="Seconds between node status heartbeats when nothing changed "
             "(default 60 for simulated nodes, 20 for a real one).")] = None,
    simulate: Annotated[int, cyclopts.Parameter(
        help="Run N simulated nodes (no containers; KWOK-style) instead of a real one; "
             "--node-name is their name prefix (default sim).")] = 0,
    simulate_zones: Annotated[int, cyclopts.Parameter(
        help="Spread simulated nodes over this many zones (zone-a, zone-b, ...).")] = 3,
    simulate_region: Annotated[str, cyclopts.Parameter(
        help="topology.kubernetes.io/region of simulated nodes.")] = "region-1",
    simulate_start_delay: Annotated[float, cyclopts.Parameter(
        help="Seconds from a pod's binding to it being Running on a simulated node.")] = 0.5,
    simulate_concurrency: Annotated[int, cyclopts.Parameter(
        help="Pod status writes and deletes in flight at once (simulated nodes).")] = 16,
    simulate_control_port: Annotated[int | None, cyclopts.Parameter(
        help="Serve the simulator's control endpoint (pause/resume heartbeats) on "
             "127.0.0.1:PORT (0: any free port).")] = None,
    cluster_dns: Annotated[str, cyclopts.Parameter(
        help="Cluster DNS address(es) for ClusterFirst pods, comma-separated ('' = none: "
             "ClusterFirst falls back to Default).")] = "10.43.0.10",
    cluster_domain: Annotated[str, cyclopts.Parameter(help="The cluster DNS domain.")] = "cluster.local",
    resolv_conf: Annotated[str, cyclopts.Parameter(
        help="The node's resolv.conf, for Default pods and the host search domains.")] = "/etc/resolv.conf",
    storage_plugin: Annotated[list[str] | None, cyclopts.Parameter(
        help="Python module (or module:function) that registers a storage driver with "
             "fleet.storage.registry (repeatable).")] = None,
    log_level: str = "INFO",
) -> None:
    """Run a node agent: register the node and run the pods bound to it."""
    from fleet.agent.config import AgentConfig
    from fleet.agent.run import run
    from fleet.network.peers import BACKENDS

    if network_backend not in BACKENDS:
        sys.exit(f"fleet agent: --network-backend must be one of {', '.join(BACKENDS)}, "
                 f"not {network_backend!r}")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per API request (heartbeats, status patches) drowns what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = AgentConfig(server_url=server or "", token=token, ca_file=ca_file, kubeconfig=kubeconfig,
                      insecure=insecure, data_dir=data_dir, port=port, address=address, driver=driver,
                      network_driver=None if network in ("none", "host", "") else network,
                      pod_cidr=pod_cidr, bridge_name=bridge_name, cluster_cidr=cluster_cidr,
                      service_cidr=service_cidr, service_proxy=service_proxy,
                      network_policy_strict=network_policy_strict,
                      network_backend=network_backend,
                      insecure_registries=list(insecure_registry or []),
                      cluster_dns=[a.strip() for a in cluster_dns.split(",") if a.strip()],
                      cluster_domain=cluster_domain, resolv_conf=resolv_conf,
                      storage_plugins=list(storage_plugin or []),
                      ca_cert_hashes=list(ca_cert_hash or []),
                      tls_cert_file=tls_cert_file, tls_key_file=tls_private_key_file,
                      client_ca_file=client_ca_file)
    if not simulate:
        cfg.registries = _registries(registries, data_dir, disable_default_registry_endpoint,
                                     "fleet agent")
    if node_name:
        cfg.node_name = node_name
    if lease_interval is not None:
        cfg.heartbeat = lease_interval
    if node_status_interval is not None:
        cfg.status_interval = node_status_interval
    if simulate:
        _simulate(cfg, count=simulate, prefix=node_name or "sim", zones=simulate_zones,
                  region=simulate_region, start_delay=simulate_start_delay,
                  concurrency=simulate_concurrency, control_port=simulate_control_port,
                  lease_interval=lease_interval, node_status_interval=node_status_interval)
        return
    from fleet._core.supervise import supervise

    # A start-up failure (a port in use, a bad flag) still ends the process; once
    # running, a crash restarts the agent in-process, which re-adopts its containers.
    from fleet.agent.bootstrap import JoinError

    try:
        trio.run(partial(supervise, "agent", partial(run, cfg), retry_start=False))
    except* JoinError as group:
        for e in _leaves(group):
            print(f"fleet agent: cannot join the cluster: {e}", file=sys.stderr)
        sys.exit(1)
    except* KeyboardInterrupt:
        pass


@app.command
def killall(
    *,
    data_dir: Annotated[Path, cyclopts.Parameter(help="The agent's state directory.")] = Path("/var/lib/fleet-agent"),
    keep_agent: Annotated[bool, cyclopts.Parameter(
        help="Refuse (exit 1) instead of stopping the agent process of DATA_DIR when it runs.",
        negative=())] = False,
    log_level: str = "WARNING",
) -> None:
    """Stop everything the node agent of DATA_DIR started (like k3s-killall.sh).

    The agent process itself (SIGTERM, SIGKILL after 10 s), every container and shim,
    pod netns, veth, the bridge, the nftables table and every mount under DATA_DIR;
    nothing of another agent.  Idempotent: a second run finds nothing and succeeds.
    Pod state on the API server is untouched: the next agent start re-creates the
    pods still bound to the node."""
    from fleet.agent import inventory

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        report = inventory.killall(data_dir, stop=not keep_agent)
    except inventory.CleanupError as e:
        print(f"fleet killall: {e}", file=sys.stderr)
        sys.exit(1)
    for what in report.removed:
        print(f"removed {what}")
    for err in report.errors:
        print(f"fleet killall: could not remove {err}", file=sys.stderr)
    if report.errors:
        sys.exit(1)


def _simulate(cfg: AgentConfig, *, count: int, prefix: str, zones: int, region: str, start_delay: float,
              concurrency: int, control_port: int | None, lease_interval: float | None,
              node_status_interval: float | None) -> None:
    """`fleet agent --simulate N`: hollow nodes in this process (fleet.agent.simulate)."""
    from fleet.agent.simulate import Simulator, SimulatorConfig
    from fleet.client import KubeconfigError

    sim_cfg = SimulatorConfig(count=count, prefix=prefix, zones=zones, region=region,
                              start_delay=start_delay, pod_concurrency=concurrency,
                              control_port=control_port, lease_duration=cfg.lease_duration)
    if lease_interval is not None:
        sim_cfg.lease_interval = lease_interval
    if node_status_interval is not None:
        sim_cfg.node_status_interval = node_status_interval
    try:
        sim_cfg.validate()
        client_cfg = cfg.client_config()
    except (ValueError, KubeconfigError) as e:
        print(f"fleet agent: error: {e}", file=sys.stderr)
        sys.exit(2)

    async def main() -> None:
        sim = Simulator(sim_cfg, client_cfg)
        async with trio.open_nursery() as n:
            await n.start(sim.run)
            print(f"Simulating {count} nodes ({sim.node_names[0]} .. {sim.node_names[-1]}), "
                  f"registered in {sim.stats.registration_seconds:.1f}s", flush=True)
            if sim.control_url:
                print(f"Simulator control endpoint on {sim.control_url}", flush=True)

    try:
        trio.run(main)
    except* KeyboardInterrupt:
        pass


@app.command(show=False)
def shim(*, bundle: Path | None = None, id: str | None = None, log: Path | None = None,
         foreground: bool = False, serve: bool = False) -> None:
    """Run one container under its shim, or (--serve) the agent's shim launcher server.

    Launched by the runtime drivers, not by people."""
    if serve:
        from fleet.runtime.shim import serve as serve_launcher

        sys.exit(serve_launcher())
    if bundle is None or id is None:
        sys.exit("fleet shim: --bundle and --id are required")
    from fleet.cli.shim import run_shim

    sys.exit(run_shim(bundle, id, log, foreground=foreground))


def _token_flags(sec: SecurityConfig, issuers: list[str] | None, audiences: list[str] | None, signing_key: Path | None,
                 key_files: list[Path] | None, max_expiration: int, extend: bool, jwks_uri: str) -> None:
    """The --service-account-* and --api-audiences flags into `sec.service_accounts`."""
    sa = sec.service_accounts
    if issuers:
        sa.issuers = [i for arg in issuers for i in arg.split(",") if i.strip()]
    if audiences:
        sa.api_audiences = [a for arg in audiences for a in arg.split(",") if a.strip()]
    sa.signing_key_file, sa.key_files = signing_key, list(key_files or [])
    for f in [signing_key, *sa.key_files]:
        if f is not None and not f.is_file():
            sys.exit(f"fleet server: {f}: no such key file")
    if max_expiration < 0:
        sys.exit("fleet server: --service-account-max-token-expiration must not be negative")
    if 0 < max_expiration < 3600:
        sys.exit("fleet server: --service-account-max-token-expiration must be at least 3600 (1h)")
    sa.max_token_expiration, sa.extend_token_expiration, sa.jwks_uri = max_expiration, extend, jwks_uri


def _registries(path: Path | None, data_dir: Path, disable_default: bool,
                command: str) -> RegistriesConfig | None:
    """The parsed registries file for an agent (fleet.agent.config.registries_config);
    a bad or unreadable file ends the command with its one-line reason."""
    from fleet.agent.config import registries_config
    from fleet.runtime.images import RegistriesConfigError

    try:
        return registries_config(path, data_dir, disable_default_endpoint=disable_default)
    except RegistriesConfigError as e:
        print(f"{command}: error: --registries: {e}", file=sys.stderr)
        sys.exit(2)


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in _leaves(e)]
    return [group]


def main() -> None:
    from fleet.cli.interrupt import restore_interrupt
    from fleet.cli.kfleet import app as kfleet_app

    restore_interrupt()  # every command stops on SIGINT, even below a parent ignoring it

    from fleet.cli.certs import app as certs_app
    from fleet.cli.secrets import app as secrets_app
    from fleet.cli.token import app as token_app

    app.command(kfleet_app, name="ctl")
    app.command(token_app, name="token")
    app.command(certs_app, name="certs")
    app.command(secrets_app, name="secrets")
    app()


if __name__ == "__main__":
    main()
