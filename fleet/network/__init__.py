"""Pod networking on a node: the network-driver seam, IPAM, namespaces, nftables.

* `driver`  — the `NetworkDriver` protocol, `PodRef` / `PodNetwork`, and the registry
  drivers are chosen from by name (`create_driver("bridge", config)`);
* `bridge`  — the in-tree driver: a Linux bridge, a veth per pod, masquerade;
* `ipam`    — host-local address allocation from the node's pod CIDR;
* `netns`   — creating, entering and deleting pinned network namespaces;
* `nft`     — atomic nftables table replacement in our own tables;
* `proxy_objects`, `proxy_rules`, `proxy_diff`, `service_proxy` — the node's Service
  dataplane (kube-proxy's nftables mode): what is read from Services and
  EndpointSlices, the table they call for, the transaction from one table to the next,
  and the agent's loop (`run_service_proxy`).
* `peers`   — the pod network across nodes as pure decisions (host-gw / VXLAN per
  peer, the route/neighbour/FDB plan); `overlay` programs it (`PeerRouter`);
* `netlink` — the pyroute2 helpers the netlink users share;
* `routetable`, `routebuild*`, `ingress*`, `nginx_conf` — Ingress and Gateway API: the
  route table every engine serves, the pure builder from the API objects, the server
  component (`ingress.run_ingress`) and its two engines (the built-in Trio proxy,
  nginx);
* `policy`, `policy_nft` — NetworkPolicy: the pure evaluation and the pod netns'
  `fleet-policy` table (the agent's loop is `fleet.agent.netpolicy`).

Only the light modules are imported here; `bridge` (and with it pyroute2) loads when a
driver named "bridge" is first asked for.
"""

from fleet.network.driver import (
    NetworkConfig,
    NetworkDriver,
    NetworkError,
    PodNetwork,
    PodRef,
    UnknownDriver,
    create_driver,
    get_driver_factory,
    register_driver,
    registered_drivers,
    unregister_driver,
)
from fleet.network.netns import create_pod_netns, delete_pod_netns

__all__ = [
    "NetworkConfig",
    "NetworkDriver",
    "NetworkError",
    "PodNetwork",
    "PodRef",
    "UnknownDriver",
    "create_driver",
    "create_pod_netns",
    "delete_pod_netns",
    "get_driver_factory",
    "register_driver",
    "registered_drivers",
    "unregister_driver",
]
