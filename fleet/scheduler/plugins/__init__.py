"""Scheduler plugins, one per file, each with only the extension points it needs.

`default_plugins()` is the default profile in kube-scheduler's default
order, which is also the filter order: cheap checks on the node object
first (cordon, name, taints, labels, ports), arithmetic over the node's pods
next (resources), then the checks that need cluster-wide counts (volumes,
topology spread, inter-pod affinity).  A node stops at its first failing
filter, so this order also decides which reason a node reports — the same
one kube-scheduler would.  `default_weights()` are kube-scheduler's score
weights.  Building a profile from names and args is `fleet.scheduler.registry`.
"""

from __future__ import annotations

from fleet.scheduler.framework import Plugin
from fleet.scheduler.plugins.image_locality import ImageLocality
from fleet.scheduler.plugins.inter_pod_affinity import InterPodAffinity
from fleet.scheduler.plugins.node_affinity import NodeAffinity
from fleet.scheduler.plugins.node_name import NodeName
from fleet.scheduler.plugins.node_ports import NodePorts
from fleet.scheduler.plugins.node_resources_balanced_allocation import (
    NodeResourcesBalancedAllocation,
)
from fleet.scheduler.plugins.node_resources_fit import NodeResourcesFit
from fleet.scheduler.plugins.node_unschedulable import NodeUnschedulable
from fleet.scheduler.plugins.pod_topology_spread import PodTopologySpread
from fleet.scheduler.plugins.taint_toleration import TaintToleration
from fleet.scheduler.plugins.volume_binding import VolumeBinding

# kube-scheduler's default score weights (pkg/scheduler/apis/config/v1/default_plugins.go).
DEFAULT_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesFit": 1,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
}


def default_plugins() -> list[Plugin]:
    """The default profile, in kube-scheduler's order (PrioritySort, preemption and binding live elsewhere)."""
    return [
        NodeUnschedulable(),
        NodeName(),
        TaintToleration(),
        NodeAffinity(),
        NodePorts(),
        NodeResourcesFit(),
        VolumeBinding(),
        PodTopologySpread(),
        InterPodAffinity(),
        NodeResourcesBalancedAllocation(),
        ImageLocality(),
    ]


def default_weights() -> dict[str, int]:
    """Score weights of the default profile (a fresh dict: callers may adjust it)."""
    return dict(DEFAULT_WEIGHTS)


__all__ = [
    "DEFAULT_WEIGHTS",
    "ImageLocality",
    "InterPodAffinity",
    "NodeAffinity",
    "NodeName",
    "NodePorts",
    "NodeResourcesBalancedAllocation",
    "NodeResourcesFit",
    "NodeUnschedulable",
    "PodTopologySpread",
    "TaintToleration",
    "VolumeBinding",
    "default_plugins",
    "default_weights",
]
