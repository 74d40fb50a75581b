"""The built-in kinds, one `KindInfo` each, grouped by API group.

`register_builtin` is the only entry point the rest of Fleet needs: the
server, discovery, tables and kfleet all read kinds from a `Registry`.
Registration order matters for discovery (the first version of a group is its
preferred version) and for `Registry.resolve` ties, so core comes first.
"""

from __future__ import annotations

from fleet.api.kinds import (
    admissionregistration,
    apiextensions,
    apiregistration,
    apps,
    authentication,
    authorization,
    autoscaling,
    batch,
    certificates,
    controllerrevision,
    coordination,
    core,
    csi,
    discovery,
    events,
    gateway,
    ingress,
    metrics,
    networking,
    networkpolicy,
    persistentvolume,
    policy,
    processcontrol,
    quota,
    rbac,
    replication,
    scheduling,
    storage,
    storageclass,
)
from fleet.api.registry import KindInfo, Registry

BUILTIN_KINDS: tuple[KindInfo, ...] = (
    *core.KINDS,
    *replication.KINDS,
    *quota.KINDS,
    *apiregistration.KINDS,
    *apiextensions.KINDS,
    *storage.KINDS,
    *persistentvolume.KINDS,
    events.CORE_EVENT,
    *apps.KINDS,
    *controllerrevision.KINDS,
    *batch.KINDS,
    *coordination.KINDS,
    *discovery.KINDS,
    *networking.KINDS,
    *ingress.KINDS,
    *networkpolicy.KINDS,
    *gateway.KINDS,
    *scheduling.KINDS,
    *policy.KINDS,
    *storageclass.KINDS,
    *csi.KINDS,
    *authorization.KINDS,
    *autoscaling.KINDS,
    *metrics.KINDS,
    *rbac.KINDS,
    *certificates.KINDS,
    events.EVENTS_EVENT,
    *authentication.KINDS,
    *admissionregistration.KINDS,
    *processcontrol.KINDS,
)


def register_builtin(reg: Registry) -> None:
    """Register every built-in kind in `reg`."""
    for info in BUILTIN_KINDS:
        reg.register(info)


__all__ = ["BUILTIN_KINDS", "register_builtin"]
