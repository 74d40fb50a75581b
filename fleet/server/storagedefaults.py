"""The storage objects a server creates at start when they are missing.

* StorageClass `local-path` — provisioner `hostpath.fleet.dev`, WaitForFirstConsumer,
  reclaimPolicy Delete, allowVolumeExpansion — the default class (annotation
  `storageclass.kubernetes.io/is-default-class: "true"`), as k3s users know it;
  unless another class is already the default, then it is created as an ordinary
  class (two defaults would make the newest, i.e. this one, win over the user's).
* StorageClass `fleet-local` — provisioner `local.fleet.dev` (capacity-enforcing
  loop-mounted volumes), WaitForFirstConsumer, Delete, allowVolumeExpansion.
* A CSIDriver object per registered storage driver (in-tree and plugins), from its
  declared capabilities: attachRequired, storageCapacity (capacity tracking),
  podInfoOnMount false, volumeLifecycleModes [Persistent], plus the annotation
  `storage.fleet.dev/enforces-capacity` saying whether a writer stops at the
  claim's size.  An existing object is left alone (the user's edits win, and
  attachRequired is immutable in Kubernetes).

Existing objects are never changed, deleted classes come back at the next start
(as k3s' local-path does).  When the API does not serve the storage kinds, nothing
is created.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fleet.api import pvmatch
from fleet.api.registry import Registry
from fleet.storage import registry as drivers
from fleet.storage.driver import Capabilities
from fleet.store import KeyExists, Store

log = logging.getLogger(__name__)

HOSTPATH_DRIVER = "hostpath.fleet.dev"
LOCAL_DRIVER = "local.fleet.dev"
DEFAULT_CLASS_NAME = "local-path"
LOCAL_CLASS_NAME = "fleet-local"
ENFORCES_CAPACITY = "storage.fleet.dev/enforces-capacity"


def default_classes(*, another_default: bool = False) -> list[dict[str, Any]]:
    """The built-in StorageClasses (fresh dicts)."""
    def sc(name: str, provisioner: str) -> dict[str, Any]:
        return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": name}, "provisioner": provisioner,
                "reclaimPolicy": "Delete", "volumeBindingMode": pvmatch.WAIT_FOR_FIRST_CONSUMER,
                "allowVolumeExpansion": True}

    local_path = sc(DEFAULT_CLASS_NAME, HOSTPATH_DRIVER)
    if not another_default:
        local_path["metadata"]["annotations"] = {pvmatch.DEFAULT_CLASS: "true"}
    return [local_path, sc(LOCAL_CLASS_NAME, LOCAL_DRIVER)]


def csidriver(name: str, caps: Capabilities) -> dict[str, Any]:
    """The CSIDriver object describing a registered driver."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": name,
                         "annotations": {ENFORCES_CAPACITY: "true" if caps.enforces_capacity else "false"}},
            "spec": {"attachRequired": caps.attach_required, "storageCapacity": caps.capacity_tracking,
                     "podInfoOnMount": False, "volumeLifecycleModes": ["Persistent"]}}


async def _create(store: Store, info: Any, obj: dict[str, Any]) -> bool:
    if info.default is not None:
        info.default(obj)
    try:
        await store.create(info.key(None, obj["metadata"]["name"]), obj)
    except KeyExists:
        return False
    return True


async def ensure_default_storage(store: Store, registry: Registry, *,
                                 driver_names: Callable[[], list[str]] = drivers.names,
                                 capabilities: Callable[[str], Capabilities | None] = drivers.capabilities,
                                 ) -> list[str]:
    """Create what is missing; -> "kind/name" of each object created."""
    created: list[str] = []
    classes = registry.get("storage.k8s.io", "v1", "storageclasses")
    if classes is not None:
        existing = await store.list(classes.key(None))
        others_default = any(pvmatch.is_default_class(o) for o in existing.items
                             if (o.get("metadata") or {}).get("name") != DEFAULT_CLASS_NAME)
        for obj in default_classes(another_default=others_default):
            if await _create(store, classes, obj):
                created.append(f"storageclass/{obj['metadata']['name']}")
    csidrivers = registry.get("storage.k8s.io", "v1", "csidrivers")
    if csidrivers is not None:
        for name in driver_names():
            try:
                caps = capabilities(name)
            except Exception:  # noqa: BLE001 - a broken plugin must not stop the server
                log.exception("storage driver %s: capabilities unavailable; no CSIDriver object", name)
                continue
            if caps is not None and await _create(store, csidrivers, csidriver(name, caps)):
                created.append(f"csidriver/{name}")
    if created:
        log.info("created storage defaults: %s", ", ".join(created))
    return created


__all__ = ["DEFAULT_CLASS_NAME", "ENFORCES_CAPACITY", "HOSTPATH_DRIVER", "LOCAL_CLASS_NAME", "LOCAL_DRIVER",
           "csidriver", "default_classes", "ensure_default_storage"]
