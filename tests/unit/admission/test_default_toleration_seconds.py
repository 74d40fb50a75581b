"""DefaultTolerationSeconds: kube-apiserver's table of which pods get which default tolerations."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.admission.default_toleration_seconds import DefaultTolerationSeconds
from fleet.auth import ADMIN, Attributes

NOT_READY = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
               "tolerationSeconds": 300}


def attrs(verb: str = "create", resource: str = "pods", subresource: str = "", group: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, subresource, "default", "p")


def pod(tolerations: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


async def mutate(obj: dict[str, Any], a: Attributes | None = None,
                 plugin: DefaultTolerationSeconds | None = None) -> dict[str, Any]:
    return await (plugin or DefaultTolerationSeconds()).mutate(a or attrs(), ADMIN, obj, None)


@pytest.mark.parametrize(("given", "want"), [
    # Cases from kube-apiserver's admission_test.go.
    (None, [NOT_READY, UNREACHABLE]),
    ([], [NOT_READY, UNREACHABLE]),
    ([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"}],
     [{"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"}, NOT_READY, UNREACHABLE]),
    # Already tolerating not-ready (any seconds, any operator) keeps that one.
    ([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
       "tolerationSeconds": 700}],
     [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
       "tolerationSeconds": 700}, UNREACHABLE]),
    ([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}],
     [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}, NOT_READY]),
    # An empty effect tolerates every effect, NoExecute included.
    ([{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
     [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}, UNREACHABLE]),
    # An empty key with Exists tolerates everything: nothing to add.
    ([{"operator": "Exists"}], [{"operator": "Exists"}]),
    ([{"operator": "Exists", "effect": "NoExecute"}], [{"operator": "Exists", "effect": "NoExecute"}]),
    # A NoSchedule toleration of the same key does not cover NoExecute.
    ([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}],
     [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
      NOT_READY, UNREACHABLE]),
])
async def test_default_tolerations(given, want):
    got = await mutate(pod(copy.deepcopy(given)))
    assert got["spec"]["tolerations"] == want


async def test_seconds_are_configurable():
    plugin = DefaultTolerationSeconds(not_ready_seconds=5, unreachable_seconds=7)
    got = await mutate(pod(), plugin=plugin)
    assert [t["tolerationSeconds"] for t in got["spec"]["tolerations"]] == [5, 7]


async def test_updates_get_them_too_and_adding_is_idempotent():
    once = await mutate(pod(), attrs("update"))
    twice = await mutate(copy.deepcopy(once), attrs("patch"))
    assert twice["spec"]["tolerations"] == [NOT_READY, UNREACHABLE]


@pytest.mark.parametrize("a", [
    attrs(subresource="status"), attrs(subresource="binding"), attrs(resource="configmaps"),
    attrs(group="apps", resource="deployments"), attrs(verb="delete"),
])
async def test_other_requests_are_left_alone(a):
    obj = pod()
    assert await mutate(obj, a) == pod()


@pytest.mark.parametrize("spec", [None, "nonsense", {"tolerations": "not-a-list"}])
async def test_malformed_pods_are_left_for_validation(spec):
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    assert await mutate(copy.deepcopy(obj)) == obj
