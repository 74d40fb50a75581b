"""The agent's configuration, and the API client built from it.

One dataclass holds everything `fleet agent` is told on its command line, so the
in-process agent of `fleet server` and tests build the same thing without a CLI.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.client import Client, ClientConfig, load_kubeconfig
from fleet.runtime.images.mirrors import RegistriesConfig, load_registries
from fleet.server.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT

if TYPE_CHECKING:
    from fleet.agent.tls import ServingSource

DEFAULT_PORT = 9301
DEFAULT_CLUSTER_CIDR = "10.42.0.0/16"
DEFAULT_SERVICE_CIDR = "10.43.0.0/16"
# The registries file read when --registries is not given: in the state directory,
# so each node (and each test's agent) has its own and no host-wide file leaks in.
REGISTRIES_FILE = "registries.yaml"


@dataclass
class AgentConfig:
    server_url: str = ""
    token: str | None = None
    ca_data: bytes | None = None
    ca_file: str | None = None
    insecure: bool = False
    # A kubeconfig to read server/token/CA from instead of the fields above.
    kubeconfig: str | None = None
    # Joining with a bootstrap token (fleet/agent/bootstrap.py): the cluster CA's
    # public key hashes to accept (--ca-cert-hash sha256:...); empty: trust the CA on
    # the token's JWS over cluster-info alone.
    ca_cert_hashes: list[str] = field(default_factory=list)
    data_dir: Path = Path("/var/lib/fleet-agent")
    node_name: str = field(default_factory=lambda: socket.gethostname().lower())
    port: int = DEFAULT_PORT
    # The address the node reports (InternalIP) and the agent API listens on;
    # empty: the first non-loopback IPv4 address, else 127.0.0.1.
    address: str = ""
    driver: str = "auto"  # auto | oci | process
    # "bridge" or None / "host": no pod networking, pods share the node's network.
    network_driver: str | None = "bridge"
    cluster_cidr: str = DEFAULT_CLUSTER_CIDR
    # This node's pod CIDR when the server does not assign one (single-node setups,
    # tests); normally left empty and read from node.spec.podCIDR.
    pod_cidr: str | None = None
    bridge_name: str | None = None
    # The Service dataplane (fleet.network.service_proxy): the service range and
    # whether this agent programs the node's Service rules at all.
    service_cidr: str = DEFAULT_SERVICE_CIDR
    service_proxy: bool = True
    # NetworkPolicy (fleet.agent.netpolicy), enforced whenever pods have their own
    # network: strict = a pod whose rules cannot be programmed gets no traffic at all
    # (fail closed) instead of keeping its previous rules (or none).
    network_policy_strict: bool = False
    # Storage driver plugin modules (fleet.storage.registry.load_plugins).
    storage_plugins: list[str] = field(default_factory=list)
    # Routes to other nodes' pod CIDRs (bridge driver): auto (host-gw for peers on a
    # directly connected subnet, VXLAN for the others), host-gw or vxlan.
    network_backend: str = "auto"
    netns_dir: str | None = None
    insecure_registries: list[str] = field(default_factory=list)
    # Registry mirrors, rewrites and per-host auth/TLS (a parsed registries.yaml; see
    # fleet.runtime.images.mirrors); None: every image from its own registry.
    registries: RegistriesConfig | None = None
    lease_duration: int = 40
    heartbeat: float = 10.0
    status_interval: float = 20.0
    labels: dict[str, str] = field(default_factory=dict)
    # Slow clients on the agent API port (fleet/server/limits.py, as
    # on the API server's): how long a connection may stay idle or take to send a
    # request's line and headers, and how long a request body may stall between
    # chunks (the request is then dropped).  Streaming responses (logs -f, exec,
    # attach) are never cut by these.
    keep_alive_timeout: float = DEFAULT_HEADER_TIMEOUT
    request_body_timeout: float = DEFAULT_BODY_TIMEOUT
    # Pods' DNS (fleet/agent/dnsconfig.py; kubelet's --cluster-dns, --cluster-domain,
    # --resolv-conf).  Without pod networking ClusterFirst pods fall back to Default.
    cluster_dns: list[str] = field(default_factory=lambda: ["10.43.0.10"])
    cluster_domain: str = "cluster.local"
    resolv_conf: str = "/etc/resolv.conf"
    # The agent API's TLS (fleet/agent/tls.py; kubelet's --tls-cert-file,
    # --tls-private-key-file, --client-ca-file), or a ServingSource (the built-in
    # agent's: the server's PKI).  Without either the API is plain HTTP with the token.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    serving_source: ServingSource | None = None
    tls_check_interval: float = 30.0
    # A ready client TLS context for the API (the built-in agent's node identity,
    # kept current by the server's certificate rotation); see ClientConfig.ssl_context.
    client_ssl_context: Any = None
    # The identity of the node-local storage provisioner (fleet.storage.provisioner),
    # as a ClientConfig: it lists claims and volumes cluster-wide and writes PVs and
    # claims' annotations, which neither the Node authorizer nor NodeRestriction allow
    # a node (Kubernetes runs it as a DaemonSet with its own ServiceAccount).  None:
    # a joined node asks for a certificate of its own (fleet.agent.bootstrap
    # .storage_identity); any other agent uses its own identity (admin or provisioner).
    storage_client: Any = None

    @property
    def api_tls(self) -> bool:
        return self.serving_source is not None or bool(self.tls_cert_file and self.tls_key_file)

    def tls_source(self) -> ServingSource | None:
        if self.serving_source is not None:
            return self.serving_source
        if self.tls_cert_file and self.tls_key_file:
            from fleet.agent.tls import FileSource

            return FileSource(self.tls_cert_file, self.tls_key_file, self.client_ca_file)
        return None

    @property
    def pod_networking(self) -> bool:
        return bool(self.network_driver) and self.network_driver != "host"

    def client_config(self) -> ClientConfig:
        if self.kubeconfig:
            return load_kubeconfig(self.kubeconfig)
        if not self.server_url:
            raise ValueError("the agent needs a server URL (or a kubeconfig)")
        return ClientConfig(server=self.server_url, token=self.token, ca_data=self.ca_data,
                            ca_file=self.ca_file, insecure_skip_tls_verify=self.insecure,
                            ssl_context=self.client_ssl_context)

    def make_client(self) -> Client:
        return Client(self.client_config(), user_agent=f"fleet-agent/{self.node_name}")


def registries_config(path: Path | str | None, state_dir: Path, *,
                      disable_default_endpoint: bool = False) -> RegistriesConfig | None:
    """The node's registries file: `path` if given (it must exist), else
    `<state_dir>/registries.yaml` if present, else none.

    Raises `RegistriesConfigError` (a ValueError naming the file and field) for a file
    that cannot be read or is malformed: better to refuse to start than to pull from
    the internet on a site that meant to use its mirror.
    """
    if path is None:
        default = Path(state_dir) / REGISTRIES_FILE
        if not default.is_file():
            return RegistriesConfig(disable_default_endpoint=True) if disable_default_endpoint else None
        path = default
    return load_registries(path, disable_default_endpoint=disable_default_endpoint)
