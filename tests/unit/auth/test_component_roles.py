"""Fleet's component roles cover what the components' code asks for.

Every controller of the controller manager is set up against a recording informer
factory: each (apiVersion, plural) it watches must be listable and watchable by
`system:kube-controller-manager` under the default policy — so a controller added
later with a new informer fails here instead of failing silently with 403s once the
manager runs under its own identity.  Likewise the scheduler's informers for
`system:kube-scheduler`, and cluster DNS and ingress for theirs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.auth import (
    AUTHENTICATED,
    KUBE_CONTROLLER_MANAGER_USER,
    KUBE_SCHEDULER_USER,
    Attributes,
    UserInfo,
)
from fleet.auth import bootstrap_policy as bp
from fleet.controllers.manager import default_controllers
from fleet.controllers.runtime import Context
from fleet.network.ingress import INPUTS
from fleet.scheduler.run import STORAGE_RESOURCES
from fleet.storage.provisioner import Provisioner
from tests.unit.auth.test_bootstrap_policy import policy


class _Anything:
    """Accepts any call or attribute (an informer's add_handler, add_index, ...)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


class RecordingFactory:
    def __init__(self) -> None:
        self.asked: set[tuple[str, str]] = set()

    def informer(self, api_version: str, plural: str, **kw: Any) -> Any:
        self.asked.add((api_version, plural))
        return _Anything()


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _can_read(user: UserInfo, resources: set[tuple[str, str]]) -> list[tuple[str, str, str]]:
    a = policy()
    return [(av, plural, verb) for av, plural in sorted(resources) for verb in ("list", "watch")
            if not a.authorize(user, Attributes(verb, _group(av), "v1", plural)).allowed]


def test_controller_manager_reads_what_its_controllers_watch(tmp_path: Path) -> None:
    factory = RecordingFactory()
    ctx = Context(client=_Anything(), informers=factory)  # type: ignore[arg-type]
    controllers: list[Any] = [*default_controllers(), Provisioner({}, None)]  # type: ignore[arg-type]
    for c in controllers:
        try:
            c.setup(ctx)
        except Exception as e:  # noqa: BLE001 - a fake context may not satisfy every setup
            pytest.fail(f"{c.name}: setup failed on the recording factory: {e!r}")
    assert ("v1", "pods") in factory.asked and ("rbac.authorization.k8s.io/v1", "clusterroles") in factory.asked
    user = UserInfo(KUBE_CONTROLLER_MANAGER_USER, groups=(AUTHENTICATED,))
    assert _can_read(user, factory.asked) == []


def test_scheduler_reads_what_it_watches() -> None:
    watched = {("v1", "nodes"), ("v1", "namespaces"), ("v1", "persistentvolumeclaims"), ("v1", "pods"),
               *((av, plural) for av, plural, _ in STORAGE_RESOURCES)}
    assert _can_read(UserInfo(KUBE_SCHEDULER_USER, groups=(AUTHENTICATED,)), watched) == []


def test_dns_and_ingress_read_what_they_watch() -> None:
    dns = {("v1", "services"), ("discovery.k8s.io/v1", "endpointslices"), ("v1", "namespaces"), ("v1", "pods")}
    assert _can_read(UserInfo(bp.CLUSTER_DNS_USER, groups=(AUTHENTICATED,)), dns) == []
    assert _can_read(UserInfo(bp.INGRESS_USER, groups=(AUTHENTICATED,)), set(INPUTS.values())) == []
