"""PersistentVolumeClaimResize: a claim may grow only if its StorageClass allows expansion.

kube-apiserver's plugin (plugin/pkg/admission/storage/persistentvolume/resize),
validating, on PersistentVolumeClaim **updates** of the main resource that ask
for more `resources.requests.storage` than before:

* the stored claim must be `Bound` ("Only bound persistent volume claims can be
  expanded");
* the claim's class (old and new, and the same) must exist and say
  `allowVolumeExpansion: true` — else 403 Forbidden with Kubernetes' words
  "only dynamically provisioned pvc can be resized and the storageclass that
  provisions the pvc must support resize".

Shrinking is not this plugin's business: validation refuses it first (422).
Classes come from the DefaultStorageClass plugin's `StorageClassCache`.
"""

from __future__ import annotations

from typing import Any

from fleet.admission.defaultstorageclass import StorageClassCache, storage_classes
from fleet.admission.priority import forbidden
from fleet.api import pvmatch
from fleet.auth import Attributes, UserInfo
from fleet.store import Store

NOT_BOUND = "Only bound persistent volume claims can be expanded"
NOT_EXPANDABLE = ("only dynamically provisioned pvc can be resized and the storageclass that provisions "
                  "the pvc must support resize")


def resize_refusal(claim: dict[str, Any], old: dict[str, Any],
                   classes: dict[str, dict[str, Any]]) -> str | None:
    """Why growing `old` into `claim` is refused, or None when it is not a growth or is allowed."""
    new_size, old_size = pvmatch.claim_request(claim), pvmatch.claim_request(old)
    if new_size is None or new_size <= (old_size if old_size is not None else 0):
        return None
    if ((old.get("status") or {}).get("phase")) != "Bound":
        return NOT_BOUND
    cls, old_cls = pvmatch.claim_class(claim), pvmatch.claim_class(old)
    if not cls or cls != old_cls:
        return NOT_EXPANDABLE
    sc = classes.get(cls)
    if sc is None or sc.get("allowVolumeExpansion") is not True:
        return NOT_EXPANDABLE
    return None


class PersistentVolumeClaimResize:
    """Validating admission plugin for PersistentVolumeClaim updates."""

    name = "PersistentVolumeClaimResize"

    def __init__(self, store: Store, cache: StorageClassCache | None = None) -> None:
        self.store = store
        self.cache = cache if cache is not None else StorageClassCache()

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if (attrs.group, attrs.resource) != ("", "persistentvolumeclaims") or attrs.subresource:
            return
        if attrs.verb not in ("update", "patch") or obj is None or old is None:
            return
        if pvmatch.claim_request(obj) is None:
            return
        classes = {str((c.get("metadata") or {}).get("name")): c
                   for c in await storage_classes(self.store, self.cache)}
        why = resize_refusal(obj, old, classes)
        if why is not None:
            raise forbidden("persistentvolumeclaims", "", attrs.name, why)
