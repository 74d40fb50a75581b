"""The cluster DNS component of `fleet server`: informers → records → listeners, and kube-dns.

Run under the server's supervision after the API answers (it is an API client like
the controllers): shared informers (`fleet.client.informer`) on Services,
EndpointSlices and Namespaces (and Pods for verified pod records) feed
`ClusterRecords`; once they have listed, the UDP/TCP listeners of
`fleet.network.dns` start (so no query is answered from an empty cache), and the
`kube-system/kube-dns` Service (ClusterIP `service_ip`, ports 53/UDP `dns` and 53/TCP
`dns-tcp`, targetPort = the listener's port) with its hand-made Endpoints (the
advertised address) is one of the server's system Services (fleet/server/systemsvc.py,
fed `kube_dns_spec`, repaired at every pass of the allocation repair loop); the node
dataplane DNATs the ClusterIP to it.

Upstream resolvers: `upstreams`, else the `nameserver`s of `resolv_conf`, minus any
that would loop back to this server.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.client import Client, ClientConfig
from fleet.client.informer import Informer
from fleet.network.dns import (
    DEFAULT_ALLOWED_CLIENTS,
    ClientFilter,
    DNSHandler,
    DNSStats,
    parse_bind,
    serve,
)
from fleet.network.dns_forward import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_TIMEOUT,
    ForwardCache,
    Forwarder,
    Upstream,
    parse_upstream,
    read_resolv_conf_upstreams,
)
from fleet.network.dns_records import DEFAULT_TTL, ClusterRecords

log = logging.getLogger(__name__)

DEFAULT_BIND = "0.0.0.0:10053"
DEFAULT_SERVICE_IP = "10.43.0.10"
DNS_NAMESPACE, DNS_SERVICE = "kube-system", "kube-dns"


@dataclass
class ClusterDNSConfig:
    # host:port of the UDP+TCP listeners; "" turns cluster DNS off.
    bind: str = DEFAULT_BIND
    domain: str = "cluster.local"
    ttl: int = DEFAULT_TTL
    # Upstream resolvers (ip[:port]); empty: the nameservers of resolv_conf.
    upstreams: list[str] = field(default_factory=list)
    resolv_conf: str = "/etc/resolv.conf"
    pod_records: str = "insecure"
    service_ip: str = DEFAULT_SERVICE_IP
    # The address written into kube-dns' Endpoints; empty: the bind host, or for a
    # wildcard bind the default-route interface's address.
    advertise: str = ""
    # Source networks that get answers (others are dropped); ["*"]: everyone.
    allow: list[str] = field(default_factory=lambda: list(DEFAULT_ALLOWED_CLIENTS))
    forward_timeout: float = DEFAULT_TIMEOUT
    max_forwards: int = DEFAULT_MAX_INFLIGHT
    cache_size: int = 10000

    def validate(self) -> None:
        """ValueError for a bad flag (checked by the CLI before anything starts)."""
        if self.bind and parse_bind(self.bind)[1] == 0:
            raise ValueError(f"{self.bind}: the port must be fixed (kube-dns' Endpoints name it)")
        if not 0 <= self.ttl <= 86400:
            raise ValueError(f"TTL {self.ttl}: must be between 0 and 86400 seconds")
        for u in self.upstreams:
            parse_upstream(u)
        self.client_filter()
        ClusterRecords(self.domain, self.ttl, self.pod_records)


    def client_filter(self) -> ClientFilter | None:
        if "*" in self.allow:
            return None
        try:
            return ClientFilter(self.allow)
        except ValueError as e:
            raise ValueError(f"--cluster-dns-allow: {e}") from e


def upstreams_for(cfg: ClusterDNSConfig, own: tuple[str, int]) -> list[Upstream]:
    ups = [parse_upstream(u) for u in cfg.upstreams] if cfg.upstreams else \
        read_resolv_conf_upstreams(cfg.resolv_conf)
    loops = {own, (cfg.service_ip, 53)}
    if own[0] in ("0.0.0.0", "::"):
        loops |= {("127.0.0.1", own[1]), ("::1", own[1])}
    return [u for u in ups if (u.host, u.port) not in loops]


def advertised_address(cfg: ClusterDNSConfig, host: str, server_address: str = "") -> str:
    """Where kube-dns' Endpoints point: `advertise`; else a specific bind host; else the
    server's own advertised address (`server_address`: its --advertise-address, or a
    non-loopback --address); else the default-route interface's address (kube-apiserver's
    --advertise-address rule) — never loopback for a wildcard bind, since pods reach it
    through a DNAT."""
    if cfg.advertise:
        return cfg.advertise
    from fleet.server.systemsvc import default_advertise_address
    if host not in ("0.0.0.0", "::"):
        return default_advertise_address(host)
    if server_address and server_address not in ("0.0.0.0", "::", "localhost") \
            and not server_address.startswith("127.") and server_address != "::1":
        return server_address
    return default_advertise_address(host)


def _slim_pod(obj: dict[str, Any]) -> dict[str, Any]:
    md = obj.get("metadata") or {}
    st = obj.get("status") or {}
    return {"metadata": {k: md[k] for k in ("namespace", "name", "uid", "resourceVersion") if k in md},
            "status": {k: st[k] for k in ("podIP", "podIPs") if k in st}}


def wire(records: ClusterRecords, client: Client) -> list[Informer]:
    """The informers feeding `records` (not started)."""
    def handler(set_fn: Any, delete_fn: Any) -> Any:
        def on_event(etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            if new is not None:
                set_fn(new)
            elif old is not None:
                md = old.get("metadata") or {}
                delete_fn(str(md.get("namespace") or ""), str(md.get("name") or ""))
        return on_event

    infs = [
        Informer(client, "v1", "services", handler(records.set_service, records.delete_service),
                 component="cluster-dns"),
        Informer(client, "discovery.k8s.io/v1", "endpointslices",
                 handler(records.set_slice, records.delete_slice), component="cluster-dns"),
        Informer(client, "v1", "namespaces",
                 handler(lambda o: records.set_namespace(o["metadata"]["name"]),
                         lambda _ns, name: records.delete_namespace(name)),
                 component="cluster-dns"),
    ]
    if records.pod_mode == "verified":
        infs.append(Informer(client, "v1", "pods", handler(records.set_pod, records.delete_pod),
                             component="cluster-dns", transform=_slim_pod))
    return infs


async def run_cluster_dns(cfg: ClusterDNSConfig, client_cfg: ClientConfig, stats: DNSStats, *,
                          task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
    host, port = parse_bind(cfg.bind)
    records = ClusterRecords(cfg.domain, cfg.ttl, cfg.pod_records)
    async with Client(client_cfg, user_agent="fleet-cluster-dns") as client, \
            trio.open_nursery() as nursery:
        for inf in wire(records, client):
            await nursery.start(inf.run)
        forwarder = Forwarder([], timeout=cfg.forward_timeout, max_inflight=cfg.max_forwards,
                              cache=ForwardCache(max_entries=cfg.cache_size))
        handler = DNSHandler(records, forwarder, stats, cfg.client_filter())
        host, port = await _bind(nursery, handler, host, port)
        forwarder.upstreams = upstreams_for(cfg, (host, port))
        log.info("cluster DNS for %s on %s:%d, upstreams %s", cfg.domain, host, port,
                 ", ".join(map(str, forwarder.upstreams)) or "none")
        task_status.started((host, port))


async def _bind(nursery: trio.Nursery, handler: DNSHandler, host: str, port: int) -> tuple[str, int]:
    """Start the listeners; while the address is taken (another server on this machine,
    a resolver on port 53) or not ours to bind, say so once and retry — not a crash."""
    delay, warned = 2.0, False
    while True:
        try:
            return await nursery.start(serve, handler, host, port)
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                raise
            if not warned:
                log.warning("cluster DNS: cannot listen on %s port %d: %s; retrying (at most every %.0fs) "
                            "(--cluster-dns-bind chooses another address, '' turns it off)",
                            host, port, e.strerror, 30.0)
                warned = True
            await trio.sleep(delay)
            delay = min(delay * 2, 30.0)


def kube_dns_spec(cfg: ClusterDNSConfig, port: int | None = None, server_address: str = ""
                  ) -> dict[str, Any]:
    """The keywords of `fleet.server.systemsvc.ensure_system_service` for kube-dns:
    ClusterIP `service_ip`, ports 53/UDP `dns` and 53/TCP `dns-tcp` → the listener's
    `port` (default: the bind port) at the advertised address."""
    host, bind_port = parse_bind(cfg.bind)
    port = port or bind_port
    return {"namespace": DNS_NAMESPACE, "name": DNS_SERVICE, "cluster_ip": cfg.service_ip,
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": port},
                      {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": port}],
            "endpoint_ips": [advertised_address(cfg, host, server_address)],
            "endpoint_ports": [{"name": "dns", "port": port, "protocol": "UDP"},
                               {"name": "dns-tcp", "port": port, "protocol": "TCP"}],
            "labels": {"k8s-app": "kube-dns"}}


__all__ = ["DEFAULT_BIND", "DEFAULT_SERVICE_IP", "ClusterDNSConfig", "advertised_address",
           "kube_dns_spec", "run_cluster_dns", "upstreams_for", "wire"]
