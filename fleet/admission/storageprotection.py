"""StorageObjectInUseProtection: new claims and volumes carry their protection finalizers.

kube-apiserver's plugin (plugin/pkg/admission/storage/storageobjectinuseprotection):
on **create** of a PersistentVolumeClaim it appends `kubernetes.io/pvc-protection`
to `metadata.finalizers`, and on create of a PersistentVolume
`kubernetes.io/pv-protection`, unless already there.  The finalizers are what
keeps a claim that a pod still uses (or a volume still bound to a claim) from
vanishing under it: deleting one only marks it, and the protection controllers
remove the finalizer once nothing uses the object any more.
"""

from __future__ import annotations

from typing import Any

from fleet.api import pvmatch
from fleet.auth import Attributes, UserInfo

FINALIZERS = {"persistentvolumeclaims": pvmatch.PVC_PROTECTION, "persistentvolumes": pvmatch.PV_PROTECTION}


class StorageObjectInUseProtection:
    """Mutating admission plugin for PersistentVolume and PersistentVolumeClaim creates."""

    name = "StorageObjectInUseProtection"

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        finalizer = FINALIZERS.get(attrs.resource)
        if attrs.group or finalizer is None or attrs.verb != "create" or attrs.subresource:
            return obj
        md = obj.get("metadata")
        if not isinstance(md, dict):
            return obj
        finalizers = md.get("finalizers")
        if finalizers is None:
            md["finalizers"] = [finalizer]
        elif isinstance(finalizers, list) and finalizer not in finalizers:
            finalizers.append(finalizer)
        return obj
