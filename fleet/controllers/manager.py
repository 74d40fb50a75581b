"""The controller manager: which controllers `fleet server` runs (in one nursery).

Each controller is a class following `fleet.controllers.runtime.Controller`; the
list below is the whole set — node lifecycle (`nodelifecycle`), node IPAM
(`nodeipam`) and namespace finalization (`namespace`) included: they share the
manager's informers and are supervised by it like the others.  The storage
controllers (`storage_controllers`) join only when the API serves their kinds.  The manager is one task of the server; with several servers it is
the part that will run only on the lease holder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fleet.controllers.runtime import Controller, Manager

if TYPE_CHECKING:
    from fleet.controllers.nodeipam import NodeIPAMConfig
    from fleet.controllers.nodelifecycle import NodeLifecycleConfig
    from fleet.controllers.rootcacertpublisher import RootCAPublisherConfig


def default_controllers(*, hpa_sync_period: float = 15.0,
                        node_lifecycle: NodeLifecycleConfig | None = None,
                        node_ipam: NodeIPAMConfig | None = None,
                        max_endpoints_per_slice: int = 100,
                        csr_signer: Any = None,
                        root_ca: RootCAPublisherConfig | None = None) -> list[Controller]:
    """`csr_signer` (an object with `sign_csr`: the server's ClusterPKI, fleet/auth/pki.py) enables the
    csrsigning controller: it needs the cluster CA's key, which only the server has."""
    from fleet.controllers.bootstrapsigner import BootstrapSigner
    from fleet.controllers.clusterroleaggregation import ClusterRoleAggregationController
    from fleet.controllers.cronjob import CronJobController
    from fleet.controllers.csrapproving import CSRApprovingController
    from fleet.controllers.csrcleaner import CSRCleanerController
    from fleet.controllers.csrsigning import CSRSigningController
    from fleet.controllers.daemonset import DaemonSetController
    from fleet.controllers.deployment import DeploymentController
    from fleet.controllers.disruption import DisruptionController
    from fleet.controllers.endpoints import EndpointsController
    from fleet.controllers.endpointslice import EndpointSliceController
    from fleet.controllers.endpointslicemirroring import EndpointSliceMirroringController
    from fleet.controllers.garbagecollector import GarbageCollector
    from fleet.controllers.hpa import HorizontalPodAutoscalerController
    from fleet.controllers.job import JobController
    from fleet.controllers.namespace import NamespaceController
    from fleet.controllers.nodeipam import NodeIPAM
    from fleet.controllers.nodelifecycle import NodeLifecycle
    from fleet.controllers.replicaset import ReplicaSetController, ReplicationManager
    from fleet.controllers.resourcequota import ResourceQuotaController
    from fleet.controllers.rootcacertpublisher import RootCACertPublisher
    from fleet.controllers.serviceaccount import ServiceAccountController
    from fleet.controllers.servicelb import ServiceLBController
    from fleet.controllers.statefulset import StatefulSetController
    from fleet.controllers.tokencleaner import TokenCleaner

    # Node join: bootstrap tokens, cluster-info's signatures, CSRs.
    join: list[Controller] = [TokenCleaner(), BootstrapSigner(), CSRApprovingController(),
                              CSRCleanerController()]
    if csr_signer is not None:
        join.append(CSRSigningController(csr_signer))
    return [
        NodeIPAM(node_ipam), NodeLifecycle(node_lifecycle),
        NamespaceController(), ServiceAccountController(), RootCACertPublisher(root_ca),
        GarbageCollector(),
        ReplicaSetController(), ReplicationManager(), DeploymentController(),
        StatefulSetController(),
        DaemonSetController(),
        HorizontalPodAutoscalerController(sync_period=hpa_sync_period),
        DisruptionController(),
        ResourceQuotaController(),
        JobController(), CronJobController(),
        EndpointSliceController(max_endpoints_per_slice), EndpointsController(),
        EndpointSliceMirroringController(),
        ServiceLBController(),
        ClusterRoleAggregationController(),
        *join,
        *storage_controllers(),
    ]


def storage_controllers() -> list[Controller]:
    """The storage controllers whose kinds the API serves (each names them in `requires`):
    an informer on a resource the server does not have would never list, and hold up
    every controller's start."""
    from fleet.api.registry import default_registry
    from fleet.controllers.attachdetach import AttachDetachController
    from fleet.controllers.ephemeral import EphemeralVolumeController
    from fleet.controllers.persistentvolume import PersistentVolumeController
    from fleet.controllers.volume_common import served
    from fleet.controllers.volumeprotection import PVCProtectionController, PVProtectionController

    candidates: list[Any] = [PersistentVolumeController(), PVCProtectionController(),
                             PVProtectionController(), EphemeralVolumeController(),
                             AttachDetachController()]
    registry = default_registry()
    return [c for c in candidates if served(c.requires, registry)]


# Controllers that exist only in some configurations (the server's storage provisioner
# runs only when a driver that is not node-local is registered), still valid names.
OPTIONAL_CONTROLLERS = ("storage-provisioner", "csrsigning")


def select(controllers: list[Controller], spec: list[str] | None) -> list[Controller]:
    """kube-controller-manager's --controllers: `*` for all, `name` to run one, `-name`
    to leave one out (e.g. ["*", "-garbagecollector"]).  A list of only `-name` items
    means all but those.  Unknown names are an error."""
    items = [i.strip() for i in spec or [] if i.strip()]
    if not items:
        return controllers
    known = {c.name for c in controllers} | set(OPTIONAL_CONTROLLERS)
    enabled = set(known) if "*" in items or all(i.startswith("-") for i in items) else set()
    for item in items:
        if item == "*":
            continue
        name = item.lstrip("-")
        if name not in known:
            raise ValueError(f"unknown controller {name!r}; known: {', '.join(sorted(known))}")
        if item.startswith("-"):
            enabled.discard(name)
        else:
            enabled.add(name)
    return [c for c in controllers if c.name in enabled]


def default_manager(controllers: list[str] | None = None, *, extra: Sequence[Controller] = (),
                    **options: Any) -> Manager:
    """`controllers` selects as `select` does, among the defaults and `extra` (those of
    OPTIONAL_CONTROLLERS this configuration runs); `options` are keyword settings of
    `default_controllers` (e.g. hpa_sync_period, node_lifecycle)."""
    return Manager(select(default_controllers(**options) + list(extra), controllers))
