"""DefaultIngressClass: give a new Ingress that names no class the cluster's default one.

kube-apiserver's plugin (plugin/pkg/admission/network/defaultingressclass):
on Ingress **create** only, when neither `spec.ingressClassName` nor the
legacy `kubernetes.io/ingress.class` annotation is set, `spec.ingressClassName`
becomes the name of the IngressClass annotated
`ingressclass.kubernetes.io/is-default-class: "true"`.  With several such
classes the newest by creationTimestamp wins, ties to the smaller name (kube
1.28+ `getDefaultClass`); with none the Ingress is left as it is.

Classes are read from an `IngressClassCache` kept current by a store watch,
as kube reads them from its lister; until the cache has synced the plugin
lists the store instead, so it is never wrong at start-up.
"""

from __future__ import annotations

from typing import Any

from fleet.api import meta
from fleet.api.kinds.ingress import ANNOTATION_INGRESS_CLASS, ANNOTATION_IS_DEFAULT_CLASS, GROUP
from fleet.auth import Attributes, UserInfo
from fleet.store import Store
from fleet.store.watchcache import WatchCache

PREFIX = meta.store_key(GROUP, "ingressclasses", None)


class IngressClassCache(WatchCache):
    """IngressClasses by name (a `WatchCache`, see fleet/store/watchcache.py)."""

    def __init__(self) -> None:
        super().__init__(PREFIX)


def _created(obj: dict[str, Any]) -> float:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    try:
        return meta.parse_rfc3339(ts).timestamp() if isinstance(ts, str) else 0.0
    except ValueError:
        return 0.0


def default_class(classes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The default IngressClass: the newest annotated one, ties broken by the smaller name."""
    defaults = [c for c in classes
                if ((c.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_IS_DEFAULT_CLASS) == "true"]
    if not defaults:
        return None
    return min(defaults, key=lambda c: (-_created(c), str(c["metadata"].get("name", ""))))


class DefaultIngressClass:
    """Mutating admission plugin for Ingress creates."""

    name = "DefaultIngressClass"

    def __init__(self, store: Store, cache: IngressClassCache | None = None) -> None:
        self.store = store
        self.cache = cache if cache is not None else IngressClassCache()

    async def _classes(self) -> list[dict[str, Any]]:
        if self.cache.synced:
            return list(self.cache.values())
        return (await self.store.list(PREFIX)).items

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        if (attrs.group, attrs.resource, attrs.verb) != (GROUP, "ingresses", "create") or attrs.subresource:
            return obj
        spec = obj.get("spec")
        if spec is not None and not isinstance(spec, dict):
            return obj  # validation reports it
        if (spec or {}).get("ingressClassName") is not None:
            return obj
        annotations = (obj.get("metadata") or {}).get("annotations")
        if isinstance(annotations, dict) and ANNOTATION_INGRESS_CLASS in annotations:
            return obj
        cls = default_class(await self._classes())
        if cls is not None:
            obj.setdefault("spec", {})
            if obj["spec"] is None:
                obj["spec"] = {}
            obj["spec"]["ingressClassName"] = cls["metadata"]["name"]
        return obj
