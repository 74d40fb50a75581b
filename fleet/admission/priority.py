"""Priority: resolve a pod's priorityClassName into spec.priority, and guard PriorityClasses.

kube-apiserver's plugin (plugin/pkg/admission/priority), with its messages:

* **Pod create** — `spec.priorityClassName` names a PriorityClass whose
  `value` becomes `spec.priority` and whose `preemptionPolicy` becomes
  `spec.preemptionPolicy`.  Without a name, the class marked `globalDefault`
  is used (and its name filled in); with no such class, priority 0 and
  PreemptLowerPriority.  An unknown name is 403 Forbidden ("no PriorityClass
  with name X was found"), and so is a pod that sets `spec.priority` (or
  `spec.preemptionPolicy`) to something else than its class says: priority
  is the cluster administrator's to give, not the pod author's.
* **Pod update** — the values resolved at creation are kept: whatever an
  update says about `spec.priority` / `spec.preemptionPolicy` is replaced by
  the stored values (this runs before validation, so a client that leaves
  them out of a full update is not refused for "changing" them).
* **PriorityClass create/update** — at most one class may be `globalDefault`
  (403); **delete** of the built-in system classes is refused (403), as
  kube-apiserver's PriorityClass storage does.

Pod creation is hot (the scheduler benchmark creates thousands per second), so
classes are read from a `ClassCache` kept current by a store watch.  A name
the cache does not know yet (a class created a moment ago) falls back to a
store read, so the cache makes admission faster but never wrong about names;
the global default, like kube-apiserver's lister, is whatever the cache saw.
"""

from __future__ import annotations

import logging
from typing import Any

from fleet.api import errors, meta
from fleet.api.kinds.scheduling import (
    DEFAULT_PRIORITY_WHEN_NO_DEFAULT_CLASS_EXISTS,
    PREEMPT_LOWER_PRIORITY,
    system_priority_classes,
)
from fleet.api.validation import as_int
from fleet.auth import Attributes, UserInfo
from fleet.store import KeyNotFound, Store
from fleet.store.watchcache import WatchCache

log = logging.getLogger(__name__)

GROUP = "scheduling.k8s.io"
RESOURCE = "priorityclasses"
PREFIX = meta.store_key(GROUP, RESOURCE, None)
SYSTEM_CLASSES = frozenset(c["metadata"]["name"] for c in system_priority_classes())


class ClassCache(WatchCache):
    """PriorityClasses by name (a `WatchCache`, see fleet/store/watchcache.py)."""

    def __init__(self) -> None:
        super().__init__(PREFIX)

    def all(self) -> list[dict[str, Any]]:
        return list(self.values())


def forbidden(resource: str, group: str, name: str, why: str) -> errors.Forbidden:
    """admission.NewForbidden: `<resource>[.<group>] "<name>" is forbidden: <why>`."""
    qualified = f"{resource}.{group}" if group else resource
    return errors.Forbidden(f'{qualified} "{name}" is forbidden: {why}', name=name, group=group, kind=resource)


def default_class(classes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The globalDefault class; if a race let two exist, the lowest value wins (as in Kubernetes)."""
    # Only well-typed classes take part: one stored before typed validation
    # (a string value) must not break every pod create.
    defaults = [c for c in classes if c.get("globalDefault") is True and isinstance(c.get("value"), int)]
    if not defaults:
        return None
    return min(defaults, key=lambda c: (c.get("value", 0), c["metadata"]["name"]))


class Priority:
    """Mutating (pods) and validating (PriorityClasses) admission plugin."""

    name = "Priority"

    def __init__(self, store: Store, cache: ClassCache | None = None) -> None:
        self.store = store
        # Without a running cache every lookup reads the store.
        self.cache = cache if cache is not None else ClassCache()

    # -- lookups -----------------------------------------------------------------------

    async def _get_class(self, name: str) -> dict[str, Any] | None:
        pc = self.cache.get(name) if self.cache.synced else None
        if pc is not None:
            return pc
        try:
            return await self.store.get(meta.store_key(GROUP, RESOURCE, None, name))
        except KeyNotFound:
            return None

    async def _classes(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        if self.cache.synced and not fresh:
            return self.cache.all()
        return (await self.store.list(PREFIX)).items

    # -- pods --------------------------------------------------------------------------

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        if (attrs.group, attrs.resource) != ("", "pods") or attrs.subresource:
            return obj
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return obj  # validation reports it
        if attrs.verb in ("update", "patch"):
            old_spec = (old or {}).get("spec") or {}
            for f in ("priority", "preemptionPolicy"):
                if old_spec.get(f) is not None:
                    spec[f] = old_spec[f]
            return obj
        if attrs.verb != "create":
            return obj
        name = spec.get("priorityClassName")
        if name is not None and not isinstance(name, str):
            return obj  # a type error: validation reports it
        given = spec.get("priority")
        if given is not None and as_int(given) is None:
            return obj
        policy: Any
        if not name:
            pc = default_class(await self._classes())
            if pc is not None:
                spec["priorityClassName"] = pc["metadata"]["name"]
                priority, policy = pc.get("value", 0), pc.get("preemptionPolicy")
            else:
                priority, policy = DEFAULT_PRIORITY_WHEN_NO_DEFAULT_CLASS_EXISTS, PREEMPT_LOWER_PRIORITY
        else:
            pc = await self._get_class(name)
            if pc is None:
                raise forbidden("pods", "", attrs.name, f"no PriorityClass with name {name} was found")
            priority, policy = pc.get("value", 0), pc.get("preemptionPolicy")
        if given is not None and given != priority:
            raise forbidden("pods", "", attrs.name,
                            f"the integer value of priority ({given}) must not be provided in pod spec; "
                            f"priority admission controller computed {priority} from the given "
                            "PriorityClass name")
        spec["priority"] = priority
        if policy is not None:
            current = spec.get("preemptionPolicy")
            if current is not None and current != policy:
                raise forbidden("pods", "", attrs.name,
                                f"the string value of PreemptionPolicy ({current}) must not be provided in "
                                f"pod spec; priority admission controller computed {policy} from the given "
                                "PriorityClass name")
            spec["preemptionPolicy"] = policy
        return obj

    # -- PriorityClasses ---------------------------------------------------------------

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if (attrs.group, attrs.resource) != (GROUP, RESOURCE) or attrs.subresource:
            return
        if attrs.verb == "delete":
            if attrs.name in SYSTEM_CLASSES:
                raise forbidden(RESOURCE, GROUP, attrs.name,
                                "this is a system priority class and cannot be deleted")
            return
        if obj is None or obj.get("globalDefault") is not True:
            return
        # A store read, not the cache: two defaults created back to back must not both pass.
        current = default_class([c for c in await self._classes(fresh=True)
                                 if c["metadata"]["name"] != attrs.name or attrs.verb == "create"])
        if current is not None:
            raise forbidden(RESOURCE, GROUP, attrs.name,
                            f"PriorityClass {current['metadata']['name']} is already marked as default. "
                            "Only one default can exist")

