"""ResourceQuota admission: the pure check (messages, deltas) and the plugin through the API
(charging status.used, refusals, dry runs, conflicts, concurrent creates)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import trio

from fleet.admission.objcache import NamespacedCache
from fleet.admission.resourcequota import (
    PREFIX,
    QuotaRefused,
    Request,
    ResourceQuota,
    check_request,
)
from fleet.api import meta
from fleet.api import quota as q
from fleet.auth import ADMIN, Attributes
from fleet.testing.apiserver import open_api

NOW = 1_800_000_000.0
PODS = "/api/v1/namespaces/default/pods"
QUOTAS = "/api/v1/namespaces/default/resourcequotas"


def quota(name: str, hard: dict[str, str], used: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"hard": hard}
    if used is not None:
        status["used"] = used
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "5"},
            "spec": {"hard": hard, **spec}, "status": status}


def pod(name: str = "p", cpu: str | None = "100m", memory: str | None = None, **spec: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    c: dict[str, Any] = {"name": "c", "image": "busybox"}
    if requests:
        c["resources"] = {"requests": requests}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [c], **spec}}


def check(quotas: list[dict[str, Any]], obj: dict[str, Any], *, group: str = "", resource: str = "pods",
          verb: str = "create", old: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return check_request(quotas, q.evaluator_for(group, resource), Request(verb), obj, old, NOW)


@pytest.mark.parametrize(("quotas", "obj", "message"), [
    ([quota("q", {"pods": "2"}, {"pods": "2"})], pod("p3"),
     "exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"),
    ([quota("compute", {"requests.cpu": "1", "pods": "10"}, {"requests.cpu": "900m", "pods": "3"})],
     pod(cpu="200m"), "exceeded quota: compute, requested: requests.cpu=200m, used: requests.cpu=900m, "
                      "limited: requests.cpu=1"),
    ([quota("mem", {"requests.memory": "1Gi", "pods": "1"}, {"requests.memory": "768Mi", "pods": "1"})],
     pod(memory="512Mi"), "exceeded quota: mem, requested: pods=1,requests.memory=512Mi, used: "
                          "pods=1,requests.memory=768Mi, limited: pods=1,requests.memory=1Gi"),
    ([quota("cpu", {"cpu": "2"}, {"cpu": "0"})], pod(cpu=None), "failed quota: cpu: must specify cpu for: c"),
    ([quota("q", {"pods": "2"})], pod(), "status unknown for quota: q, resources: pods"),
    ([quota("ok", {"pods": "5"}, {"pods": "0"}), quota("tight", {"count/pods": "1"}, {"count/pods": "1"})],
     pod(), "exceeded quota: tight, requested: count/pods=1, used: count/pods=1, limited: count/pods=1"),
])
def test_refusals_are_worded_as_kube_apiserver(quotas: list[dict[str, Any]], obj: dict[str, Any],
                                               message: str) -> None:
    with pytest.raises(QuotaRefused) as e:
        check(quotas, obj)
    assert str(e.value) == message


def test_a_fitting_create_is_charged_to_every_quota_that_applies() -> None:
    qs = [quota("a", {"pods": "5", "requests.cpu": "2"}, {"pods": "1", "requests.cpu": "500m"}),
          quota("b", {"count/configmaps": "1"}, {"count/configmaps": "0"}),
          quota("c", {"pods": "5"}, {"pods": "0"}, scopes=["BestEffort"])]
    out = check(qs, pod(cpu="250m"))
    assert out[0]["status"]["used"] == {"pods": "2", "requests.cpu": "750m"}
    assert out[1] is qs[1] and out[2] is qs[2]  # untouched: nothing they count / scope excludes it
    assert qs[0]["status"]["used"] == {"pods": "1", "requests.cpu": "500m"}  # inputs are not changed


def test_quota_names_nothing_the_object_uses() -> None:
    qs = [quota("storage", {"requests.storage": "1Gi"}, {"requests.storage": "0"})]
    assert check(qs, pod()) == qs


def test_updates_are_charged_only_what_they_add() -> None:
    svc = {"metadata": {"name": "s", "namespace": "default", "resourceVersion": "3"},
           "spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}
    qs = [quota("svc", {"services": "5", "services.nodeports": "1"}, {"services": "5", "services.nodeports": "0"})]
    to_nodeport = copy.deepcopy(svc)
    to_nodeport["spec"]["type"] = "NodePort"
    # services is already at its limit, yet the update adds only a node port.
    out = check(qs, to_nodeport, resource="services", verb="update", old=svc)
    assert out[0]["status"]["used"] == {"services": "5", "services.nodeports": "1"}
    two_ports = copy.deepcopy(to_nodeport)
    two_ports["spec"]["ports"].append({"port": 81})
    with pytest.raises(QuotaRefused, match="requested: services.nodeports=2"):
        check(qs, two_ports, resource="services", verb="update", old=svc)


# -- through the in-process API ---------------------------------------------------------


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        yield a


async def make_quota(api, name: str, hard: dict[str, str], **spec: Any) -> None:
    """Create a quota and do what the quota controller would: mirror hard, zero usage."""
    code, body = await api.json("POST", QUOTAS, {"apiVersion": "v1", "kind": "ResourceQuota",
                                                 "metadata": {"name": name}, "spec": {"hard": hard, **spec}})
    assert code == 201, body
    body["status"] = {"hard": hard, "used": {k: "0" for k in hard}}
    code, body = await api.json("PUT", f"{QUOTAS}/{name}/status", body)
    assert code == 200, body


async def used(api, name: str) -> dict[str, str]:
    code, body = await api.json("GET", f"{QUOTAS}/{name}")
    assert code == 200
    return body["status"]["used"]


async def test_creates_are_charged_and_refused_with_403(api):
    await make_quota(api, "q", {"pods": "2", "requests.cpu": "1"})
    for name in ("p1", "p2"):
        code, body = await api.json("POST", PODS, pod(name, cpu="300m"))
        assert code == 201, body
    assert await used(api, "q") == {"pods": "2", "requests.cpu": "600m"}
    code, body = await api.json("POST", PODS, pod("p3"))
    assert code == 403
    assert body["reason"] == "Forbidden"
    assert body["message"] == ('pods "p3" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, '
                               "limited: pods=2")
    assert (await api.json("GET", f"{PODS}/p3"))[0] == 404


async def test_dry_run_checks_but_does_not_charge(api):
    await make_quota(api, "q", {"pods": "1"})
    code, _ = await api.json("POST", PODS, pod(), query={"dryRun": "All"})
    assert code == 201
    assert await used(api, "q") == {"pods": "0"}


async def test_object_counts_of_any_kind(api):
    await make_quota(api, "objects", {"count/configmaps": "1", "secrets": "0"})
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}
    assert (await api.json("POST", "/api/v1/namespaces/default/configmaps", cm))[0] == 201
    cm["metadata"]["name"] = "b"
    code, body = await api.json("POST", "/api/v1/namespaces/default/configmaps", cm)
    assert (code, body["message"]) == (403, 'configmaps "b" is forbidden: exceeded quota: objects, requested: '
                                             "count/configmaps=1, used: count/configmaps=1, limited: "
                                             "count/configmaps=1")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
    code, body = await api.json("POST", "/api/v1/namespaces/default/secrets", secret)
    assert code == 403 and "requested: secrets=1, used: secrets=0, limited: secrets=0" in body["message"]
    # Other namespaces are not limited.
    assert (await api.json("POST", "/api/v1/namespaces/kube-system/secrets", secret))[0] == 201


async def test_concurrent_creates_never_exceed_the_quota(api):
    await make_quota(api, "q", {"pods": "5"})
    codes: list[int] = []

    async def create(i: int) -> None:
        codes.append((await api.json("POST", PODS, pod(f"p{i}")))[0])

    async with trio.open_nursery() as n:
        for i in range(20):
            n.start_soon(create, i)
    assert sorted(codes) == [201] * 5 + [403] * 15
    assert await used(api, "q") == {"pods": "5"}
    _, listed = await api.json("GET", PODS)
    assert len(listed["items"]) == 5


async def test_a_charge_that_loses_a_race_is_re_evaluated(api):
    """Another writer (the controller, another server) changed the quota between our read and
    our write: the charge is redone against the fresh quota."""
    await make_quota(api, "q", {"pods": "2"})
    plugin = next(p for p in api.server.admission.validating if isinstance(p, ResourceQuota))
    store = api.store
    real_update = store.update
    raced = False

    async def racing_update(key: str, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        nonlocal raced
        if not raced and key.startswith(PREFIX):
            raced = True
            current = await store.get(key)
            current["status"]["used"] = {"pods": "2"}  # someone else took the room
            await real_update(key, current)
        return await real_update(key, obj, **kw)

    store.update = racing_update  # type: ignore[method-assign]
    try:
        with pytest.raises(Exception) as e:
            await plugin.validate(Attributes("create", "", "v1", "pods", "", "default", "p"), ADMIN, pod(), None)
    finally:
        store.update = real_update  # type: ignore[method-assign]
    assert getattr(e.value, "code", None) == 403
    assert "used: pods=2" in str(e.value)


async def test_the_cache_short_cuts_namespaces_without_quotas(tmp_path):
    async with open_api(tmp_path) as a, trio.open_nursery() as n:
        cache = NamespacedCache(PREFIX)
        await n.start(cache.run, a.store)
        plugin = ResourceQuota(a.store, cache)
        attrs = Attributes("create", "", "v1", "pods", "", "default", "p")
        await plugin.validate(attrs, ADMIN, pod(), None)  # no quota: nothing to do
        obj = quota("q", {"pods": "0"}, {"pods": "0"})
        obj["metadata"].pop("resourceVersion")
        await a.store.create(meta.store_key("", "resourcequotas", "default", "q"), obj)
        with trio.fail_after(5):
            while not cache.in_namespace("default"):
                await trio.sleep(0.01)
        with pytest.raises(Exception, match="exceeded quota: q"):
            await plugin.validate(attrs, ADMIN, pod(), None)
        n.cancel_scope.cancel()
