"""Scheduler plugins, one per file, each with only the extension points it needs.

`default_plugins()` is the default profile, in filter order: cheap checks on
the node object first (cordon, name, taints, labels), arithmetic over the
node's pods last, as kube-scheduler orders them.
"""

from __future__ import annotations

from fleet.scheduler.framework import Plugin
from fleet.scheduler.plugins.node_name import NodeName
from fleet.scheduler.plugins.node_resources_fit import NodeResourcesFit
from fleet.scheduler.plugins.node_selector import NodeAffinity
from fleet.scheduler.plugins.node_unschedulable import NodeUnschedulable
from fleet.scheduler.plugins.taint_toleration import TaintToleration


def default_plugins() -> list[Plugin]:
    return [NodeUnschedulable(), NodeName(), TaintToleration(), NodeAffinity(), NodeResourcesFit()]


__all__ = ["NodeAffinity", "NodeName", "NodeResourcesFit", "NodeUnschedulable", "TaintToleration",
           "default_plugins"]
