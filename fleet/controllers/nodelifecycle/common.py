"""The node lifecycle controller's shared vocabulary: its configuration, the taint keys
and zone labels it owns, and small pure accessors over nodes and pods.

Every other module of the package (health, taints, eviction, zones, controller) reads
these; none of them does I/O.  See the package docstring for how the parts fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.api import meta
from fleet.api.conditions import get_condition
from fleet.client.informer import object_key

LEASE_NAMESPACE = "kube-node-lease"

TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NO_EXECUTE = "NoExecute"
NO_SCHEDULE = "NoSchedule"
# The NoExecute taints this controller owns (and may remove).
CONTROLLER_NO_EXECUTE = (TAINT_UNREACHABLE, TAINT_NOT_READY)

# TaintNodesByCondition: condition type -> status -> NoSchedule taint key.
CONDITION_TAINTS: dict[str, dict[str, str]] = {
    "Ready": {"False": TAINT_NOT_READY, "Unknown": TAINT_UNREACHABLE},
    "MemoryPressure": {"True": "node.kubernetes.io/memory-pressure"},
    "DiskPressure": {"True": "node.kubernetes.io/disk-pressure"},
    "NetworkUnavailable": {"True": "node.kubernetes.io/network-unavailable"},
    "PIDPressure": {"True": "node.kubernetes.io/pid-pressure"},
}
MANAGED_NO_SCHEDULE = frozenset({TAINT_UNSCHEDULABLE} | {k for m in CONDITION_TAINTS.values()
                                                         for k in m.values()})

# The conditions set to Unknown when a node goes silent (NetworkUnavailable is
# the network plugin's, not the kubelet's, so it is left alone — as in k8s).
KUBELET_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
LEGACY_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
LEGACY_REGION_LABEL = "failure-domain.beta.kubernetes.io/region"
EXCLUDE_DISRUPTION_LABEL = "node.kubernetes.io/exclude-disruption"

STATE_INITIAL = "Initial"
STATE_NORMAL = "Normal"
STATE_PARTIAL = "PartialDisruption"
STATE_FULL = "FullDisruption"

NODE_CONTROLLER = "node-controller"
TAINT_EVICTION_CONTROLLER = "taint-eviction-controller"
POD_GC = "pod-garbage-collector"

# eviction_deadline's answer for "now": an untolerated taint.
EVICT_NOW = -math.inf


@dataclass
class NodeLifecycleConfig:
    """Kubernetes' kube-controller-manager flags of the same names (seconds, nodes/s)."""

    monitor_grace_period: float = 40.0
    startup_grace_period: float = 60.0
    # The longest the monitor sleeps without a reason (retries, periodic re-checks).
    monitor_period: float = 5.0
    eviction_rate: float = 0.1
    secondary_eviction_rate: float = 0.01
    unhealthy_zone_threshold: float = 0.55
    large_cluster_size_threshold: int = 50
    # Pods bound to a missing node are deleted after this long (default: the grace period).
    orphan_quarantine: float | None = None
    eviction_workers: int = 8
    write_concurrency: int = 16
    # After an informer event wakes the monitor, wait this long so a burst is one pass.
    coalesce: float = 0.05
    retry_backoff: float = 1.0

    @property
    def quarantine(self) -> float:
        return self.monitor_grace_period if self.orphan_quarantine is None else self.orphan_quarantine


# ---------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------

rfc3339 = meta.format_time  # metav1.Time of a wall-clock time


parse_time = meta.parse_epoch  # an RFC 3339 timestamp as a Unix time (None if bad)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv is not None else None


def _rv_int(obj: Mapping[str, Any]) -> int:
    try:
        return int(_rv(obj) or -1)
    except ValueError:
        return -1


def ready_status(node: Mapping[str, Any]) -> str | None:
    """"True", "False", "Unknown", or None when the node never posted Ready."""
    c = get_condition(node, "Ready")
    return str(c.get("status")) if c is not None else None


def node_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]


def no_execute_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node_taints(node) if t.get("effect") == NO_EXECUTE]


def zone_key(node: Mapping[str, Any]) -> str:
    """Kubernetes' GetZoneKey: region and zone joined, "" when the node has neither."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    region = labels.get(REGION_LABEL) or labels.get(LEGACY_REGION_LABEL) or ""
    zone = labels.get(ZONE_LABEL) or labels.get(LEGACY_ZONE_LABEL) or ""
    if not region and not zone:
        return ""
    return f"{region}:\x00:{zone}"


def excluded_from_disruption(node: Mapping[str, Any]) -> bool:
    return EXCLUDE_DISRUPTION_LABEL in ((node.get("metadata") or {}).get("labels") or {})


def pod_key(pod: Mapping[str, Any]) -> str:
    return object_key(dict(pod))


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_tolerations(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]

