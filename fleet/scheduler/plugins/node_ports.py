"""NodePorts: a pod's host ports must be free on the node.

A container port with `hostPort` binds (hostIP, protocol, hostPort) on the
node, so two pods asking for the same one cannot share a node.  The rules
are kube-scheduler's HostPortInfo: protocol defaults to TCP and hostIP to
0.0.0.0; a wanted 0.0.0.0 conflicts with that protocol/port on *any* IP in
use, and a wanted specific IP conflicts with the same IP or with 0.0.0.0.
(As upstream, `::` is not treated as a wildcard.)  Sidecars — restartable
init containers — hold their ports while the pod runs, so they count too.

Unschedulable, not unresolvable: preempting the pod holding the port frees
it.  Pods without host ports skip the plugin.
"""

from __future__ import annotations

from typing import Any

from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.podinfo import WILDCARD_HOST_IP, HostPort, pod_host_ports
from fleet.scheduler.snapshot import NodeInfo

ERR_REASON = "node(s) didn't have free ports for the requested pod ports"
_CONFLICT = Status.unschedulable(ERR_REASON)


def port_conflict(wanted: HostPort, node: NodeInfo) -> bool:
    """Whether the node already binds something that clashes with `wanted`."""
    ip, proto, port = wanted
    in_use = node.used_ports.get((proto, port))
    if not in_use:
        return False
    if ip == WILDCARD_HOST_IP:
        return True  # any IP holding that protocol/port
    return ip in in_use or WILDCARD_HOST_IP in in_use


class NodePorts:
    name = "NodePorts"
    _key = "NodePorts/wanted"

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        wanted = pod_host_ports(pod)
        if not wanted:
            return Status(Code.SKIP)
        state.write(self._key, wanted)
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        if not node.used_ports:
            return Status.success()
        for wanted in state.read(self._key):
            if port_conflict(wanted, node):
                return _CONFLICT
        return Status.success()
