"""DefaultStorageClass: give a new claim that names no class the cluster's default StorageClass.

kube-apiserver's plugin (plugin/pkg/admission/storage/storageclass/setdefault):
on PersistentVolumeClaim **create** only, when the claim has no class at all —
neither `spec.storageClassName` (an explicit `""` counts as a class: "no class,
bind only to class-less volumes") nor the legacy
`volume.beta.kubernetes.io/storage-class` annotation — `spec.storageClassName`
becomes the name of the class annotated
`storageclass.kubernetes.io/is-default-class: "true"`.  With several such
classes the newest wins, ties to the smaller name (`fleet.api.pvmatch.default_class`,
kube's `GetDefaultClass`); with none the claim is left as it is, and the PV
controller gives it the default class later, should one appear.

Classes are read from a `StorageClassCache` kept current by a store watch, as
kube reads them from its lister; until the cache has synced the plugin lists the
store instead, so it is never wrong at start-up.  PersistentVolumeClaimResize
reads the same cache.
"""

from __future__ import annotations

from typing import Any

from fleet.api import meta, pvmatch
from fleet.api.kinds.storageclass import GROUP
from fleet.auth import Attributes, UserInfo
from fleet.store import Store
from fleet.store.watchcache import WatchCache

PREFIX = meta.store_key(GROUP, "storageclasses", None)


class StorageClassCache(WatchCache):
    """StorageClasses by name (a `WatchCache`, see fleet/store/watchcache.py)."""

    def __init__(self) -> None:
        super().__init__(PREFIX)


async def storage_classes(store: Store, cache: StorageClassCache) -> list[dict[str, Any]]:
    """Every StorageClass: from the cache once it has synced, from the store before."""
    if cache.synced:
        return list(cache.values())
    return (await store.list(PREFIX)).items


def claim_has_class(claim: dict[str, Any]) -> bool:
    """helper.PersistentVolumeClaimHasClass: the annotation, or a storageClassName (even "")."""
    annotations = (claim.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict) and pvmatch.BETA_STORAGE_CLASS in annotations:
        return True
    spec = claim.get("spec")
    return isinstance(spec, dict) and spec.get("storageClassName") is not None


class DefaultStorageClass:
    """Mutating admission plugin for PersistentVolumeClaim creates."""

    name = "DefaultStorageClass"

    def __init__(self, store: Store, cache: StorageClassCache | None = None) -> None:
        self.store = store
        self.cache = cache if cache is not None else StorageClassCache()

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        if (attrs.group, attrs.resource, attrs.verb) != ("", "persistentvolumeclaims", "create") \
                or attrs.subresource:
            return obj
        spec = obj.get("spec")
        if spec is not None and not isinstance(spec, dict):
            return obj  # validation reports it
        if claim_has_class(obj):
            return obj
        cls = pvmatch.default_class(await storage_classes(self.store, self.cache))
        if cls is not None:
            if obj.get("spec") is None:
                obj["spec"] = {}
            obj["spec"]["storageClassName"] = cls["metadata"]["name"]
        return obj
