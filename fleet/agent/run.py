"""The node agent as one Trio service: `run(cfg)`.

Start-up order, each step `nursery.start`-ed so the next one can rely on it:

1. the API client, the image store (`<data_dir>/images`), the runtime driver
   (`<data_dir>/runtime`);
2. Node registration (retried until the server answers), then the Lease and
   node-status loops;
3. the pod network: the node's pod CIDR (waited for when the server has not
   assigned one yet) and the network driver — or none, for `network_driver=None`
   (pods then share the node's network and report its address, like hostNetwork);
   a driver that routes to other nodes (`PeerRouting`) gets the Nodes from an
   informer (`fleet.agent.podnet`) for as long as the agent runs;
4. start-time garbage collection: the claimed volumes of pods gone meanwhile are
   unpublished and unstaged through their drivers (`fleet.agent.csivolumes`), then
   (`fleet.agent.inventory.collect_garbage`) every
   container, shim, pod netns, veth, mount and cgroup of this agent that no pod
   bound to the node owns any more is removed (a pod deleted while the agent was
   down, a crash mid-teardown), so nothing leaks across restarts;
5. pod sync: recovery of surviving containers, then list + watch;
6. the agent API (logs, exec, attach, stats) on `cfg.port`, when
   `fleet.agent.api` is part of this build;
7. with pod networking (and `service_proxy`), the node's Service rules
   (`fleet.network.service_proxy`, table `inventory.proxy_table_for(bridge)`),
   supervised; they are left in place when the agent stops;
8. with pod networking, NetworkPolicy in each local pod's netns
   (`fleet.agent.netpolicy`, supervised; `network_policy_strict` fails closed): it
   shares the Service and EndpointSlice informers, and the pod sandbox calls its
   `prepare_netns` before a new pod's containers start.  Its tables live in the pods'
   namespaces and go with them.

Before anything else the agent writes its record, `<data_dir>/agent.json` (pid and
its `/proc` start time, node name, netns dir, bridge and nftables table): the pid
file `fleet killall` reads to find this agent's process and node-level resources.

`task_status.started(AgentInfo)` comes once registered and syncing.  Cancelling
the nursery stops the agent but *not* the containers: they live under their
shims, and the next start re-adopts them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.agent import api, imagegc, inventory
from fleet.agent import bootstrap as node_bootstrap
from fleet.agent import env as agent_env
from fleet.agent import volumes as agent_volumes
from fleet.agent.config import AgentConfig
from fleet.agent.csivolumes import NodeVolumes
from fleet.agent.dnsconfig import NodeDNS
from fleet.agent.events import EventRecorder
from fleet.agent.images import StoreImages
from fleet.agent.netpolicy import EnforcerConfig, PolicyEnforcer
from fleet.agent.node import NodeAgent
from fleet.agent.podnet import PeerSync
from fleet.agent.satokens import ServiceAccountTokens
from fleet.agent.sync import PodSync
from fleet.agent.tls import AgentTLS
from fleet.agent.worker import WorkerEnv
from fleet.client import ApiException, Client
from fleet.client.informer import Informer
from fleet.network.driver import PeerRouting
from fleet.runtime.driver import select_driver
from fleet.server.limits import ClientTimeouts
from fleet.storage import registry as storage_registry

log = logging.getLogger(__name__)


@dataclass
class AgentInfo:
    node_name: str
    address: str
    driver: str
    pod_cidr: str | None
    api_url: str | None
    sync: PodSync


def make_network(cfg: AgentConfig, pod_cidr: str, address: str | None = None) -> Any:
    from fleet.network import NetworkConfig, create_driver

    # A bridge of its own also gets an nftables table of its own, so agents with
    # different bridges on one machine never replace each other's rules.
    options: dict[str, Any] = ({"bridge": cfg.bridge_name,
                                "nft_table": inventory.nft_table_for(cfg.bridge_name)}
                               if cfg.bridge_name else {})
    if cfg.network_backend and cfg.network_driver == "bridge":
        options["backend"] = cfg.network_backend
    state = cfg.data_dir / "network"
    state.mkdir(parents=True, exist_ok=True)
    assert cfg.network_driver
    return create_driver(cfg.network_driver, NetworkConfig(
        pod_cidr=pod_cidr, state_dir=str(state), cluster_cidr=cfg.cluster_cidr,
        options=options, node_name=cfg.node_name, node_address=address))


async def run(cfg: AgentConfig, *,
              task_status: trio.TaskStatus[AgentInfo] = trio.TASK_STATUS_IGNORED) -> None:
    from fleet.agent.images_api import image_routes
    from fleet.runtime.images import ImageStore

    cfg.data_dir = Path(cfg.data_dir)
    await trio.to_thread.run_sync(lambda: cfg.data_dir.mkdir(parents=True, exist_ok=True))
    # A bootstrap token: join (or reuse the kubeconfig of an earlier join) and
    # authenticate as system:node:<name> from then on (fleet/agent/bootstrap.py).
    # First of all: a refused token leaves nothing behind on the machine.
    joined = await node_bootstrap.node_credentials(cfg)
    if joined is not None:
        cfg.kubeconfig = str(cfg.data_dir / node_bootstrap.KUBECONFIG_NAME)
    storage_registry.load_plugins(cfg.storage_plugins)
    bridge = (cfg.bridge_name or "fleet0") if cfg.network_driver == "bridge" else None
    proxy_table = (inventory.proxy_table_for(cfg.bridge_name)
                   if cfg.pod_networking and cfg.service_proxy else None)
    record = inventory.current_record(cfg.data_dir, node_name=cfg.node_name,
                                      netns_dir=cfg.netns_dir, bridge=bridge,
                                      proxy_table=proxy_table)
    await trio.to_thread.run_sync(inventory.write_record, cfg.data_dir, record)
    prefer = None if cfg.driver in ("", "auto") else cfg.driver
    driver = select_driver(cfg.data_dir / "runtime", prefer=prefer)
    store = await ImageStore.open(cfg.data_dir / "images")
    client_cfg = cfg.client_config()
    async with cfg.make_client() as client:
        node = NodeAgent(cfg, client, driver_name=driver.name)
        if joined is not None and not (cfg.tls_cert_file and cfg.tls_key_file):
            # Before registering: the Node's annotation tells the server to dial HTTPS.
            await _joined_api_tls(client, cfg, [node.address, cfg.address])
        await node.register()
        pod_cidr: str | None = None
        network = None
        if cfg.pod_networking:
            pod_cidr = await node.wait_pod_cidr()
            network = make_network(cfg, pod_cidr, node.address)
            log.info("pod network: %s driver on %s", cfg.network_driver, pod_cidr)
        # One Service informer: the pods' service-link variables, the Service rules and
        # NetworkPolicy; one EndpointSlice informer: the Service rules and NetworkPolicy.
        services = Informer(client, "v1", "services", component="agent")
        slices = (Informer(client, "discovery.k8s.io/v1", "endpointslices", component="agent")
                  if network is not None else None)
        events = EventRecorder(client, cfg.node_name)
        policy = (make_policy_enforcer(cfg, driver, network, node.address, events)
                  if network is not None else None)
        env = WorkerEnv(client=client, driver=driver,
                        images=StoreImages(store, cfg.insecure_registries, cfg.registries),
                        data_dir=cfg.data_dir, host_ip=node.address, network=network,
                        netns_dir=cfg.netns_dir,
                        env=agent_env, volumes=agent_volumes,
                        node_allocatable=lambda: _allocatable(node),
                        events=events,
                        services=services.list,
                        netns_ready=(policy.prepare_netns
                                     if policy is not None and policy.cfg.enforceable else None),
                        # No pod network, no way to the cluster DNS ClusterIP.
                        dns=NodeDNS(tuple(cfg.cluster_dns) if network is not None else (),
                                    cfg.cluster_domain, cfg.resolv_conf))
        # Projected serviceAccountToken sources: bound tokens via TokenRequest, cached
        # and refreshed before they expire (fleet.agent.satokens).
        env.tokens = ServiceAccountTokens(client)
        # Claimed volumes (persistentVolumeClaim / ephemeral) through the storage
        # drivers registered above (fleet.agent.csivolumes).
        env.csi = NodeVolumes(client, cfg.data_dir, cfg.node_name, events=events,
                              node_labels=lambda: (node.node.get("metadata") or {}).get("labels")
                              or {})
        node.volumes_in_use = env.csi.volumes_in_use
        sync = PodSync(cfg.node_name, env)
        await collect_garbage(client, cfg, record, csi=env.csi)
        async with trio.open_nursery() as n:
            # The driver's helpers (the warm shim launcher) and the event sender
            # before any pod starts.
            await n.start(driver.serve)
            if env.events is not None:
                await n.start(env.events.run)
            n.start_soon(node.lease_loop)
            if joined is not None:
                # Renew the node's client certificate at 2/3 of its lifetime, and keep a
                # kubelet-serving certificate for the agent API (<data-dir>/kubelet-serving.*).
                n.start_soon(node_bootstrap.rotate_client_certificate, client, cfg.node_name, cfg.data_dir)
                n.start_soon(node_bootstrap.keep_serving_certificate, client, cfg.node_name, cfg.data_dir,
                             [node.address, cfg.address])
                n.start_soon(node_bootstrap.keep_client_ca, client, cfg.data_dir)
            if isinstance(network, PeerRouting):
                n.start_soon(PeerSync(client, cfg.node_name, network).run)
            n.start_soon(node.status_loop)
            # CSINode, node-side expansion, stagings nobody uses.
            n.start_soon(env.csi.run)
            # Pods start only once every Service has been read (as the kubelet's
            # serviceHasSynced gate): their service-link variables need them.
            await n.start(services.run)
            if slices is not None:
                n.start_soon(slices.run)  # its users wait for its first list
            if proxy_table:
                # The node's Service rules (fleet.network.service_proxy).  Not waited
                # for: pods start meanwhile; the rules of a previous run stay live
                # until the first sync replaces them in one transaction.
                n.start_soon(_run_service_proxy, client, cfg, proxy_table, services, slices)
            if storage_registry.names():
                # Provisioning for the node_local storage drivers: claims whose selected
                # node is this one, volumes pinned here (fleet.storage.provisioner).
                n.start_soon(_run_storage_provisioner, client, cfg, node, env.csi.drivers, joined)
            if policy is not None:
                # NetworkPolicy in each local pod's netns (fleet.agent.netpolicy).  Not
                # waited for either: a new pod's set-up waits for its own rules (bounded).
                n.start_soon(_run_network_policy, client, policy, services, slices)
            await n.start(sync.run)
            # Under disk pressure, unused images go (least recently used first);
            # any image a pod on this node names is kept.
            n.start_soon(partial(imagegc.run, store, cfg.data_dir / "images",
                                 lambda: imagegc.images_in_use(w.pod for w in list(sync.workers.values()))))
            api_url = None
            # A joined node has no bearer token the server would present: its agent API
            # serves mutual TLS only (the join token must never open it).
            token = client_cfg.token or (cfg.token if joined is None else None)
            source = cfg.tls_source()
            agent_tls = (AgentTLS(source, cfg.data_dir / "tls", check_interval=cfg.tls_check_interval)
                         if source is not None else None)
            if agent_tls is not None or token:
                address = cfg.address or "0.0.0.0"
                if agent_tls is not None:
                    # The names the API server may dial: the node's address and name.
                    agent_tls.start([node.address, cfg.node_name, "localhost", "127.0.0.1", "::1",
                                     *([cfg.address] if cfg.address else [])])
                    n.start_soon(agent_tls.run)
                api_url = await n.start(lambda task_status: api.serve(
                    sync, address=address, port=cfg.port, token=token,
                    node_name=cfg.node_name, extra_routes=image_routes(store),
                    timeouts=ClientTimeouts(keep_alive_timeout=cfg.keep_alive_timeout,
                                            body_timeout=cfg.request_body_timeout),
                    tls=agent_tls, task_status=task_status))
                log.info("agent API on %s", api_url)
            else:
                log.warning("no TLS certificate and no bearer token: the agent API (logs, exec, "
                            "attach) is off")
            log.info("agent for node %s running (driver %s, pid %d)", cfg.node_name,
                     driver.name, os.getpid())
            task_status.started(AgentInfo(node_name=cfg.node_name, address=node.address,
                                          driver=driver.name, pod_cidr=pod_cidr,
                                          api_url=api_url, sync=sync))


# What obtaining a certificate or bundle from the API may fail with, to be retried.
JOIN_ERRORS = (ApiException, node_bootstrap.JoinError, httpx.HTTPError, OSError, ValueError)


async def _joined_api_tls(client: Any, cfg: AgentConfig, addresses: list[str]) -> None:
    """A joined node's agent API: its kubelet-serving certificate (a CSR the approver
    grants for the node's own name) and the client CA that verifies the API server,
    as files the API's TLS re-reads when `keep_serving_certificate` renews them."""
    from fleet._core.supervise import retry

    cert, key = await retry("agent API certificate", lambda: node_bootstrap.serving_certificate(
        client, cfg.node_name, cfg.data_dir, [a for a in addresses if a]), JOIN_ERRORS, logger=log)
    ca = await retry("client CA bundle", lambda: node_bootstrap.client_ca_bundle(client, cfg.data_dir),
                     JOIN_ERRORS, logger=log)
    cfg.tls_cert_file, cfg.tls_key_file, cfg.client_ca_file = str(cert), str(key), str(ca)


async def collect_garbage(client: Any, cfg: AgentConfig, record: inventory.AgentRecord, *,
                          csi: NodeVolumes | None = None) -> None:
    """Remove what no pod bound to this node owns (see `fleet.agent.inventory`).

    Runs before pod sync, so no worker is creating anything meanwhile; a pod bound
    after the list has nothing on the machine yet, so nothing of it can be removed."""
    backoff = 0.5
    while True:
        try:
            res = await client.list("v1", "pods", field_selector=f"spec.nodeName={cfg.node_name}")
            break
        except (ApiException, httpx.TransportError, OSError) as e:
            log.warning("garbage collection: listing pods failed: %s; retrying in %.1fs",
                        e, backoff)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
    live = {str((p.get("metadata") or {}).get("uid") or "") for p in res.get("items") or []
            if isinstance(p, dict)} - {""}
    if csi is not None:
        # Claimed volumes of pods gone meanwhile through their drivers first (unpublish,
        # unstage), so the blind unmounting below finds nothing of them.
        await csi.recover(live)
    report = await trio.to_thread.run_sync(
        lambda: inventory.collect_garbage(cfg.data_dir, live, record))
    if report.removed or report.errors:
        log.info("garbage collection: removed %d leftover(s), %d could not be removed "
                 "(see the warnings above)", len(report.removed), len(report.errors))


async def _run_service_proxy(client: Any, cfg: AgentConfig, table: str, services: Any,
                             slices: Any) -> None:
    from fleet._core.supervise import supervise
    from fleet.network.service_proxy import ServiceProxyConfig, run_service_proxy

    pcfg = ServiceProxyConfig(node_name=cfg.node_name, cluster_cidr=cfg.cluster_cidr,
                              service_cidr=cfg.service_cidr or None, table=table)
    await supervise("service-proxy", partial(run_service_proxy, client, pcfg, services=services,
                                             slices=slices))


async def _run_storage_provisioner(client: Any, cfg: AgentConfig, node: NodeAgent,
                                   drivers: Any, joined: Any) -> None:
    from fleet._core.supervise import supervise
    from fleet.storage.provisioner import run_node_provisioner

    labels = dict((node.node.get("metadata") or {}).get("labels") or {})
    labels.setdefault("kubernetes.io/hostname", cfg.node_name)

    async def provision(c: Any) -> None:
        await supervise("storage-provisioner", partial(run_node_provisioner, c, node_name=cfg.node_name,
                                                       node_labels=labels, data_dir=cfg.data_dir,
                                                       drivers=drivers))

    if cfg.storage_client is not None:
        async with Client(cfg.storage_client, user_agent="fleet-storage-provisioner") as own:
            await provision(own)
    elif joined is not None:
        # A node's own rights do not cover provisioning (see AgentConfig.storage_client):
        # a certificate of its own, asked for as the node and renewed like the node's.
        from fleet._core.supervise import retry

        ident = node_bootstrap.storage_identity(cfg.node_name)
        creds = await retry("storage provisioner certificate", lambda: node_bootstrap.identity_credentials(
            client, cfg.node_name, cfg.data_dir, ident), JOIN_ERRORS, logger=log)
        async with Client(creds, user_agent="fleet-storage-provisioner") as own, trio.open_nursery() as n:
            n.start_soon(partial(node_bootstrap.rotate_client_certificate, client, cfg.node_name,
                                 cfg.data_dir, ident=ident, holder=own))
            await provision(own)
    else:
        await provision(client)


def make_policy_enforcer(cfg: AgentConfig, driver: Any, network: Any, address: str,
                         events: Any) -> PolicyEnforcer:
    """The node's NetworkPolicy enforcer.  Its pods' own node may always reach them (as
    Kubernetes requires: probes): host traffic to a pod comes from the bridge gateway."""
    always = [a for a in (str(getattr(network, "gateway", "") or ""), address) if a]
    return PolicyEnforcer(EnforcerConfig(
        node_name=cfg.node_name, netns_dir=cfg.netns_dir, strict=cfg.network_policy_strict,
        always_allow=tuple(dict.fromkeys(always)), driver=getattr(driver, "name", ""),
        # A driver whose containers stay in the node's netns (process) cannot be fenced.
        enforceable=getattr(driver, "joins_pod_netns", True)), events=events)


async def _run_network_policy(client: Any, policy: PolicyEnforcer, services: Any,
                              slices: Any) -> None:
    from fleet._core.supervise import supervise

    await supervise("network-policy", partial(policy.run, client, services=services,
                                              slices=slices))


def _allocatable(node: NodeAgent) -> dict[str, Any] | None:
    """status.allocatable of our Node as last written (the status loop keeps it fresh)."""
    return (node.node.get("status") or {}).get("allocatable")
