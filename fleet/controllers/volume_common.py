"""What the storage controllers share: the resources they watch, the pod → claim index,
the guard that keeps a controller out of the manager until its kinds are served, and
the write of an object whose metadata/spec and status changed.

The storage controllers (persistentvolume, pvc/pv-protection, ephemeral-volume,
attachdetach) each watch kinds the API may not serve yet (the kinds arrive
separately); an informer on an unserved resource never finishes its first list and
would hold up the whole manager, so `default_controllers` asks `served(...)` first.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from fleet.api import pvmatch
from fleet.client import ApiException

CORE = "v1"
STORAGE = "storage.k8s.io/v1"
PVS = (CORE, "persistentvolumes")
PVCS = (CORE, "persistentvolumeclaims")
PODS = (CORE, "pods")
NODES = (CORE, "nodes")
CLASSES = (STORAGE, "storageclasses")
CSINODES = (STORAGE, "csinodes")
CSIDRIVERS = (STORAGE, "csidrivers")
CAPACITIES = (STORAGE, "csistoragecapacities")
ATTACHMENTS = (STORAGE, "volumeattachments")

POD_CLAIM_INDEX = "pod-claims"


def by_pod_claim(pod: dict[str, Any]) -> list[str]:
    """Index: "namespace/claim" for every claim the pod's volumes use."""
    ns = (pod.get("metadata") or {}).get("namespace") or ""
    return [f"{ns}/{c}" for c in pvmatch.pod_claim_names(pod)]


def served(resources: Iterable[tuple[str, str]], registry: Any = None) -> bool:
    """Every (apiVersion, plural) is a kind of the built-in API registry."""
    if registry is None:
        from fleet.api.registry import default_registry
        registry = default_registry()
    for api_version, plural in resources:
        group, _, version = api_version.rpartition("/")
        if registry.get(group, version, plural) is None:
            return False
    return True


def _without_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "status"}
    md = dict(out.get("metadata") or {})
    for k in ("resourceVersion", "managedFields", "generation"):
        md.pop(k, None)
    out["metadata"] = md
    return out


async def write_object(client: Any, resource: tuple[str, str], old: Mapping[str, Any],
                       new: Mapping[str, Any]) -> dict[str, Any] | None:
    """Store `new` (computed from `old`): a PUT of the object when its metadata or spec
    changed, then a PUT of the status subresource when the status still differs.
    Each PUT carries the resourceVersion it was computed from, so a concurrent change
    is a 409 for the caller to retry on fresh data.  None when the object is gone."""
    api_version, plural = resource
    md = new.get("metadata") or {}
    ns, name = md.get("namespace") or None, str(md.get("name") or "")
    current: dict[str, Any] = copy.deepcopy(dict(old))
    try:
        if _without_status(new) != _without_status(old):
            body = copy.deepcopy(dict(new))
            body.setdefault("apiVersion", api_version)
            current = await client.replace(api_version, plural, name, body, ns)
        if (current.get("status") or {}) != (new.get("status") or {}):
            body = copy.deepcopy(current)
            body["status"] = copy.deepcopy(new.get("status") or {})
            current = await client.replace(api_version, plural, name, body, ns, subresource="status")
    except ApiException as e:
        if e.code == 404:
            return None
        raise
    return current


__all__ = ["ATTACHMENTS", "CAPACITIES", "CLASSES", "CSIDRIVERS", "CSINODES", "NODES", "PODS",
           "POD_CLAIM_INDEX", "PVCS", "PVS", "by_pod_claim", "served", "write_object"]
