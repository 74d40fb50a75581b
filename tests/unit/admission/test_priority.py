"""The Priority admission plugin: priorityClassName → spec.priority, and PriorityClass guards.

First against the plugin with a real store (with and without its watch-fed
cache), then through the in-process API so the pipeline order (mutating
admission before validation) is covered too.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import trio

from fleet.admission.priority import ClassCache, Priority, default_class
from fleet.api import errors, meta
from fleet.auth import ADMIN, Attributes
from fleet.store import open_store
from fleet.testing.apiserver import open_api

PCS = "/apis/scheduling.k8s.io/v1/priorityclasses"
PODS = "/api/v1/namespaces/default/pods"


def pc(name: str, value: int, *, default: bool = False, policy: str | None = "PreemptLowerPriority") -> dict:
    obj: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                           "metadata": {"name": name}, "value": value}
    if default:
        obj["globalDefault"] = True
    if policy is not None:
        obj["preemptionPolicy"] = policy
    return obj


def pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def pod_attrs(verb: str = "create", subresource: str = "") -> Attributes:
    return Attributes(verb, "", "v1", "pods", subresource, "default", "p")


def pc_attrs(verb: str, name: str) -> Attributes:
    return Attributes(verb, "scheduling.k8s.io", "v1", "priorityclasses", "", "", name)


@pytest.fixture(params=["store", "cache"])
async def plugin(request, tmp_path):
    """The plugin over a store holding classes `high` (1000), `never` (10, Never) and
    `low` (-5); once reading the store, once through a running cache."""
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        for obj in (pc("high", 1000), pc("never", 10, policy="Never"), pc("low", -5)):
            await store.create(meta.store_key("scheduling.k8s.io", "priorityclasses", None,
                                              obj["metadata"]["name"]), obj)
        async with trio.open_nursery() as nursery:
            cache = None
            if request.param == "cache":
                cache = ClassCache()
                await nursery.start(cache.run, store)
            yield Priority(store, cache), store
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("spec", "priority", "policy"), [
    ({"priorityClassName": "high"}, 1000, "PreemptLowerPriority"),
    ({"priorityClassName": "never"}, 10, "Never"),
    ({"priorityClassName": "low"}, -5, "PreemptLowerPriority"),
    # Restating what the class says is allowed.
    ({"priorityClassName": "high", "priority": 1000}, 1000, "PreemptLowerPriority"),
    ({"priorityClassName": "never", "preemptionPolicy": "Never"}, 10, "Never"),
    # No name, no default class: 0 and PreemptLowerPriority.
    ({}, 0, "PreemptLowerPriority"),
    ({"priority": 0}, 0, "PreemptLowerPriority"),
])
async def test_resolves_the_class(plugin, spec, priority, policy):
    p, _ = plugin
    got = await p.mutate(pod_attrs(), ADMIN, pod(**spec), None)
    assert got["spec"]["priority"] == priority
    assert got["spec"]["preemptionPolicy"] == policy
    assert got["spec"].get("priorityClassName") == spec.get("priorityClassName")


@pytest.mark.parametrize(("spec", "message"), [
    ({"priorityClassName": "nope"}, 'pods "p" is forbidden: no PriorityClass with name nope was found'),
    ({"priorityClassName": "high", "priority": 7},
     'pods "p" is forbidden: the integer value of priority (7) must not be provided in pod spec; priority '
     "admission controller computed 1000 from the given PriorityClass name"),
    ({"priority": 7},
     'pods "p" is forbidden: the integer value of priority (7) must not be provided in pod spec; priority '
     "admission controller computed 0 from the given PriorityClass name"),
    ({"priorityClassName": "never", "preemptionPolicy": "PreemptLowerPriority"},
     'pods "p" is forbidden: the string value of PreemptionPolicy (PreemptLowerPriority) must not be '
     "provided in pod spec; priority admission controller computed Never from the given PriorityClass name"),
])
async def test_refusals_are_403_with_kube_wording(plugin, spec, message):
    p, _ = plugin
    with pytest.raises(errors.Forbidden) as exc:
        await p.mutate(pod_attrs(), ADMIN, pod(**spec), None)
    assert exc.value.code == 403 and exc.value.message == message
    assert exc.value.status()["details"] == {"name": "p", "kind": "pods"}


async def test_global_default_class_is_used_and_named(plugin):
    p, store = plugin
    await store.create(meta.store_key("scheduling.k8s.io", "priorityclasses", None, "dflt"), pc("dflt", 42, default=True))
    with trio.fail_after(5):
        while p.cache.synced and p.cache.get("dflt") is None:
            await trio.sleep(0.01)
    got = await p.mutate(pod_attrs(), ADMIN, pod(), None)
    assert (got["spec"]["priority"], got["spec"]["priorityClassName"]) == (42, "dflt")
    # A named class still wins over the default.
    got = await p.mutate(pod_attrs(), ADMIN, pod(priorityClassName="high"), None)
    assert got["spec"]["priority"] == 1000


async def test_class_created_after_the_cache_synced_is_found(plugin):
    p, store = plugin
    # Written straight to the store: a cache that has not seen it yet must read it.
    await store.create(meta.store_key("scheduling.k8s.io", "priorityclasses", None, "fresh"), pc("fresh", 3))
    got = await p.mutate(pod_attrs(), ADMIN, pod(priorityClassName="fresh"), None)
    assert got["spec"]["priority"] == 3


async def test_updates_keep_the_admitted_values(plugin):
    p, _ = plugin
    old = await p.mutate(pod_attrs(), ADMIN, pod(priorityClassName="never"), None)
    new = copy.deepcopy(old)
    del new["spec"]["priority"]
    new["spec"]["preemptionPolicy"] = "PreemptLowerPriority"
    got = await p.mutate(pod_attrs("update"), ADMIN, new, old)
    assert (got["spec"]["priority"], got["spec"]["preemptionPolicy"]) == (10, "Never")


@pytest.mark.parametrize("a", [pod_attrs(subresource="status"), pod_attrs(subresource="binding"),
                               pod_attrs(verb="delete")])
async def test_subresources_and_deletes_are_not_touched(plugin, a):
    p, _ = plugin
    obj = pod(priorityClassName="nope")
    assert await p.mutate(a, ADMIN, copy.deepcopy(obj), None) == obj


async def test_malformed_pods_are_left_for_validation(plugin):
    p, _ = plugin
    for obj in (pod(priorityClassName=5), pod(priority="high"), {"metadata": {"name": "p"}, "spec": "x"}):
        assert await p.mutate(pod_attrs(), ADMIN, copy.deepcopy(obj), None) == obj


async def test_only_one_global_default(plugin):
    p, store = plugin
    await p.validate(pc_attrs("create", "d1"), ADMIN, pc("d1", 1, default=True), None)
    await store.create(meta.store_key("scheduling.k8s.io", "priorityclasses", None, "d1"), pc("d1", 1, default=True))
    with pytest.raises(errors.Forbidden) as exc:
        await p.validate(pc_attrs("create", "d2"), ADMIN, pc("d2", 2, default=True), None)
    assert exc.value.message == ('priorityclasses.scheduling.k8s.io "d2" is forbidden: PriorityClass d1 is '
                                 "already marked as default. Only one default can exist")
    # Marking another existing class default is refused too; d1 itself may stay default.
    with pytest.raises(errors.Forbidden):
        await p.validate(pc_attrs("update", "high"), ADMIN, pc("high", 1000, default=True), pc("high", 1000))
    await p.validate(pc_attrs("update", "d1"), ADMIN, pc("d1", 1, default=True), pc("d1", 1, default=True))
    await p.validate(pc_attrs("create", "d3"), ADMIN, pc("d3", 3), None)


async def test_system_classes_cannot_be_deleted(plugin):
    p, _ = plugin
    for name in ("system-cluster-critical", "system-node-critical"):
        with pytest.raises(errors.Forbidden) as exc:
            await p.validate(pc_attrs("delete", name), ADMIN, None, pc(name, 1))
        assert exc.value.message == (f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: this is a '
                                     "system priority class and cannot be deleted")
    await p.validate(pc_attrs("delete", "high"), ADMIN, None, pc("high", 1000))


def test_default_class_race_picks_the_lowest_value():
    classes = [pc("a", 5, default=True), pc("b", 1, default=True), pc("c", 0)]
    assert default_class(classes)["metadata"]["name"] == "b"
    assert default_class([pc("c", 0)]) is None


# -- through the API pipeline ---------------------------------------------------------


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        yield a


async def test_pipeline_create_and_update(api):
    assert (await api.json("POST", PCS, pc("high", 1000)))[0] == 201
    code, got = await api.json("POST", PODS, pod(priorityClassName="high"))
    assert code == 201, got
    assert (got["spec"]["priority"], got["spec"]["preemptionPolicy"]) == (1000, "PreemptLowerPriority")
    # A full update that leaves priority out is not "changing" it: admission restores it
    # before validation looks.
    body = copy.deepcopy(got)
    del body["spec"]["priority"]
    body["metadata"]["labels"] = {"x": "y"}
    code, upd = await api.json("PUT", f"{PODS}/p", body)
    assert code == 200, upd
    assert upd["spec"]["priority"] == 1000 and upd["metadata"]["labels"] == {"x": "y"}


async def test_pipeline_unknown_class_is_403(api):
    code, body = await api.json("POST", PODS, pod(priorityClassName="nope"))
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"] == 'pods "p" is forbidden: no PriorityClass with name nope was found'


async def test_system_classes_exist_and_are_guarded(api):
    code, body = await api.json("GET", PCS)
    assert code == 200
    got = {i["metadata"]["name"]: (i["value"], i.get("globalDefault", False), i["preemptionPolicy"])
           for i in body["items"]}
    assert got == {"system-cluster-critical": (2000000000, False, "PreemptLowerPriority"),
                   "system-node-critical": (2000001000, False, "PreemptLowerPriority")}
    code, body = await api.json("DELETE", f"{PCS}/system-node-critical")
    assert code == 403
    code, got = await api.json("POST", PODS, pod(priorityClassName="system-node-critical"))
    assert code == 201 and got["spec"]["priority"] == 2000001000
