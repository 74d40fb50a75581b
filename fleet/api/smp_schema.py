"""Strategic-merge-patch metadata for the built-in kinds.

Kubernetes decides how a strategic merge patch treats a list by reading the
`patchStrategy` / `patchMergeKey` struct tags of the Go API types.  We have no
Go types, so this module writes that metadata down as a small tree that
`fleet.api.patch` walks alongside the object:

* a *map node* is a `dict[str, node]` naming the fields whose behaviour is not
  the default.  Fields it does not mention behave generically: maps merge
  recursively and lists are replaced whole — exactly what Kubernetes does for
  an untagged field.
* a *list node* is a `ListSchema`: `strategy="merge"` with a `merge_key`
  merges lists of objects item by item; `strategy="merge"` without a key is a
  primitive list merged as an ordered set (`metadata.finalizers`); `item` is
  the map node for the list's elements (so `env` inside `containers` is found).

The tags below follow k8s.io/api (core/v1, apps/v1, batch/v1, meta/v1).  Only
tagged fields are listed; e.g. `tolerations`, `command`, `args`, `envFrom` and
`readinessGates` are untagged upstream and so are replaced whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ListSchema:
    """How one list field merges (see the module docstring)."""

    merge_key: str | None = None
    strategy: str = "replace"  # "merge" or "replace"
    item: dict[str, Any] | None = None


def keyed(key: str, item: dict[str, Any] | None = None) -> ListSchema:
    """A list of objects merged item by item on `key`."""
    return ListSchema(merge_key=key, strategy="merge", item=item)


# A primitive list merged as an ordered set (patchStrategy=merge, no key).
PRIMITIVE_SET = ListSchema(merge_key=None, strategy="merge")

OBJECT_META: dict[str, Any] = {
    "finalizers": PRIMITIVE_SET,
    "ownerReferences": keyed("uid"),
}

# Conditions of every built-in status that tags them (Pod, Node, Namespace,
# Service, the apps/v1 and batch/v1 workloads, PVCs, HPAs) merge on `type`.
CONDITIONS = keyed("type")

# Container and EphemeralContainer share these tags (EphemeralContainerCommon).
CONTAINER: dict[str, Any] = {
    "ports": keyed("containerPort"),
    "env": keyed("name"),
    "volumeMounts": keyed("mountPath"),
    "volumeDevices": keyed("devicePath"),
}

POD_SPEC: dict[str, Any] = {
    "volumes": keyed("name"),
    "initContainers": keyed("name", CONTAINER),
    "containers": keyed("name", CONTAINER),
    "ephemeralContainers": keyed("name", CONTAINER),
    "imagePullSecrets": keyed("name"),
    "hostAliases": keyed("ip"),
    "topologySpreadConstraints": keyed("topologyKey"),
    "resourceClaims": keyed("name"),
    "schedulingGates": keyed("name"),
}

POD_STATUS: dict[str, Any] = {
    "conditions": CONDITIONS,
    "podIPs": keyed("ip"),
    "hostIPs": keyed("ip"),
    "resourceClaimStatuses": keyed("name"),
}

POD_TEMPLATE_SPEC: dict[str, Any] = {
    "metadata": OBJECT_META,
    "spec": POD_SPEC,
}

_STATUS_WITH_CONDITIONS: dict[str, Any] = {"status": {"conditions": CONDITIONS}}


def _with_meta(**fields: Any) -> dict[str, Any]:
    return {"metadata": OBJECT_META, **fields}


def _workload(**spec_fields: Any) -> dict[str, Any]:
    """A pod-template kind (Deployment, ReplicaSet, ...) with status conditions."""
    return _with_meta(spec={"template": POD_TEMPLATE_SPEC, **spec_fields},
                      status={"conditions": CONDITIONS})


_SCHEMAS: dict[str, dict[str, Any]] = {
    "Pod": _with_meta(spec=POD_SPEC, status=POD_STATUS),
    "PodTemplate": _with_meta(template=POD_TEMPLATE_SPEC),
    "Deployment": _workload(),
    "ReplicaSet": _workload(),
    "ReplicationController": _workload(),
    "StatefulSet": _workload(),
    "DaemonSet": _workload(),
    "Job": _workload(),
    "CronJob": _with_meta(spec={"jobTemplate": {"metadata": OBJECT_META,
                                                "spec": {"template": POD_TEMPLATE_SPEC}}}),
    "Service": _with_meta(spec={"ports": keyed("port")}, status={"conditions": CONDITIONS}),
    "Node": _with_meta(
        spec={"podCIDRs": PRIMITIVE_SET},
        status={"addresses": keyed("type"), "conditions": CONDITIONS},
    ),
    "Namespace": _with_meta(**_STATUS_WITH_CONDITIONS),
    "PersistentVolumeClaim": _with_meta(**_STATUS_WITH_CONDITIONS),
    "HorizontalPodAutoscaler": _with_meta(**_STATUS_WITH_CONDITIONS),
    "CSINode": _with_meta(spec={"drivers": keyed("name")}),
}

# Everything else (ConfigMap, Secret, Endpoints, Lease, ...) only has tagged
# fields in its ObjectMeta.
_GENERIC: dict[str, Any] = _with_meta()


def schema_for(kind: str) -> dict[str, Any]:
    """The strategic-merge schema root for a built-in `kind` (generic if unknown)."""
    return _SCHEMAS.get(kind, _GENERIC)


def field_schema(node: dict[str, Any] | None, name: str) -> Any:
    """The child node for field `name` of map node `node` (None when untagged)."""
    if not node:
        return None
    return node.get(name)
