"""The admission stage: mutating plugins, then validating plugins.

A plugin sees the request attributes, the new object and the old one (on
update/delete).  Mutating plugins return the (possibly changed) object;
validating plugins raise an `APIError` to refuse.  Built-in plugins live one
per module beside this one (`priority.py`, `default_toleration_seconds.py`,
`limitranger.py`, `resourcequota.py`, `defaultingressclass.py`, `defaultstorageclass.py`,
`storageprotection.py`, `pvcresize.py`, `noderestriction.py`, `serviceaccount.py`); the dynamic
webhooks (`webhook.py`) and ValidatingAdmissionPolicy (`policy.py`, CEL) join the same chain:
MutatingAdmissionWebhook after the built-in mutating plugins, then ValidatingAdmissionPolicy and
ValidatingAdmissionWebhook after the built-in validating ones but before ResourceQuota,
kube-apiserver's order.

The server runs the two halves around the kind's validation, as
kube-apiserver does: mutating admission, then validation of the (mutated)
object, then validating admission.  So what a mutating plugin adds is
validated like anything a client sent, and a plugin that restores a field on
update (Priority keeps `spec.priority`) runs before the update is judged.
Mutating plugins therefore see objects that have been defaulted but not yet
validated: they must tolerate any JSON shape and leave wrong types for
validation to report.

A plugin may also add warnings to the response (`add_warning`, kube's
`warning.AddWarning`: the API server sends them as `Warning` headers, which
kubectl prints, on success and refusal alike) and audit annotations to the
request's audit event (`fleet.auth.audit.record_annotation`).  Both travel in
context variables the server sets per request, so the plugin interface stays
`mutate` / `validate`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.auth import Attributes, UserInfo

# The warnings of the request being served (None: not in a request, e.g. a unit test
# calling a plugin directly: warnings are dropped).
_WARNINGS: ContextVar[list[str] | None] = ContextVar("fleet_admission_warnings", default=None)


def add_warning(message: str) -> None:
    """Add a warning to the response of the request being served (duplicates once)."""
    warnings = _WARNINGS.get()
    if warnings is not None and message not in warnings:
        warnings.append(message)


@contextmanager
def collect_warnings() -> Iterator[list[str]]:
    """Collect the warnings admission adds while serving one request."""
    warnings: list[str] = []
    token = _WARNINGS.set(warnings)
    try:
        yield warnings
    finally:
        _WARNINGS.reset(token)


class MutatingPlugin(Protocol):
    name: str

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]: ...


class ValidatingPlugin(Protocol):
    name: str

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None: ...


@dataclass
class AdmissionChain:
    mutating: list[MutatingPlugin] = field(default_factory=list)
    validating: list[ValidatingPlugin] = field(default_factory=list)

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        """Run the mutating plugins in order; return the mutated object."""
        for m in self.mutating:
            obj = await m.mutate(attrs, user, obj, old)
        return obj

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        """Run the validating plugins; the first refusal raises."""
        for v in self.validating:
            await v.validate(attrs, user, obj, old)

    async def admit(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                    old: dict[str, Any] | None) -> dict[str, Any] | None:
        """Both halves back to back (requests with no kind validation in between:
        deletes, bindings, evictions)."""
        if obj is not None:
            obj = await self.mutate(attrs, user, obj, old)
        await self.validate(attrs, user, obj, old)
        return obj


def builtin_chain(store: Any, *, not_ready_seconds: int = 300, unreachable_seconds: int = 300,
                  priority_cache: Any = None, limit_range_cache: Any = None,
                  quota_cache: Any = None, ingress_class_cache: Any = None,
                  storage_class_cache: Any = None, service_account_cache: Any = None,
                  mount_service_account_tokens: bool = False, pod_security: Any = None,
                  namespace_cache: Any = None,
                  webhooks: tuple[MutatingPlugin, ValidatingPlugin] | None = None,
                  policies: ValidatingPlugin | None = None) -> AdmissionChain:
    """The chain `fleet server` runs, in kube-apiserver's recommended plugin order
    (LimitRanger, ServiceAccount, then Priority before DefaultTolerationSeconds;
    ResourceQuota last, so it charges exactly what the others let through).  NodeRestriction
    judges writes by nodes first (it only concerns users `system:node:<name>`).

    `priority_cache` is a running `priority.ClassCache`; without one the
    Priority plugin reads PriorityClasses from `store` on every pod create.
    `limit_range_cache` / `quota_cache` are running `objcache.NamespacedCache`s of
    LimitRanges / ResourceQuotas; without them those plugins read the store.
    `ingress_class_cache` is a running `defaultingressclass.IngressClassCache`
    (DefaultIngressClass, last of the mutating plugins as in kube's order);
    without one that plugin lists IngressClasses from the store.
    `storage_class_cache` is a running `defaultstorageclass.StorageClassCache`, read by
    DefaultStorageClass and PersistentVolumeClaimResize (kube's order puts them, with
    StorageObjectInUseProtection, after DefaultTolerationSeconds); without one they list
    StorageClasses from the store.
    `service_account_cache` is a running `serviceaccount.ServiceAccountCache` (the
    ServiceAccount plugin; without one it reads the store), and
    `mount_service_account_tokens` makes it add the `kube-api-access-*` token volume
    (on when the server serves TokenRequest).
    `pod_security` is PodSecurity's `podsecurity.Config` (None: the defaults — privileged
    unless a namespace's labels say otherwise); it reads namespaces' labels from
    `namespace_cache` (fleet/server/nscache.py; without one, from the store).  It judges
    the mutated objects, after NodeRestriction, as in kube's order.
    `webhooks` is the (MutatingAdmissionWebhook, ValidatingAdmissionWebhook) pair of
    `webhook.webhook_plugins`: the mutating one runs last of the mutating plugins, the
    validating one last of the validating plugins before ResourceQuota (kube's order,
    so quota charges only what the webhooks let through).
    `policies` is the ValidatingAdmissionPolicy plugin (policy.py): after the built-in
    validating plugins, before ValidatingAdmissionWebhook (kube's order).
    """
    # Imported here: the plugins import the store and the kinds, which need not
    # load for code that only wants the chain's types.
    from fleet.admission.default_toleration_seconds import DefaultTolerationSeconds
    from fleet.admission.defaultingressclass import DefaultIngressClass
    from fleet.admission.defaultstorageclass import DefaultStorageClass, StorageClassCache
    from fleet.admission.limitranger import LimitRanger
    from fleet.admission.noderestriction import NodeRestriction
    from fleet.admission.podsecurity import PodSecurity
    from fleet.admission.priority import Priority
    from fleet.admission.pvcresize import PersistentVolumeClaimResize
    from fleet.admission.resourcequota import ResourceQuota
    from fleet.admission.serviceaccount import ServiceAccount
    from fleet.admission.storageprotection import StorageObjectInUseProtection

    priority = Priority(store, priority_cache)
    service_account = ServiceAccount(store, service_account_cache,
                                     mount_tokens=mount_service_account_tokens)
    limit_ranger = LimitRanger(store, limit_range_cache)
    storage_classes = storage_class_cache if storage_class_cache is not None else StorageClassCache()
    mutating: list[MutatingPlugin] = [
        limit_ranger, service_account, priority, DefaultTolerationSeconds(not_ready_seconds, unreachable_seconds),
        DefaultStorageClass(store, storage_classes), StorageObjectInUseProtection(),
        DefaultIngressClass(store, ingress_class_cache)]
    validating: list[ValidatingPlugin] = [NodeRestriction(store), PodSecurity(store, pod_security, namespace_cache),
                                          limit_ranger, service_account, priority,
                                          PersistentVolumeClaimResize(store, storage_classes)]
    if policies is not None:
        validating.append(policies)
    if webhooks is not None:
        mutating.append(webhooks[0])
        validating.append(webhooks[1])
    validating.append(ResourceQuota(store, quota_cache))
    return AdmissionChain(mutating=mutating, validating=validating)
