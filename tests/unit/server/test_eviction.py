"""pods/eviction through the in-process API, and the disruption-budget seam."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api import errors, meta
from fleet.api.registry import KindInfo
from fleet.server import eviction
from fleet.server.discovery import aggregated, api_resource_list
from fleet.testing.apiserver import open_api

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str = "p", node: str | None = None, phase: str | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}], **spec}
    if node:
        s["nodeName"] = node
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "a"}},
                           "spec": s}
    return obj


def ev(name: str = "p", api_version: str = "policy/v1", **delete_options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": api_version, "kind": "Eviction",
                            "metadata": {"name": name, "namespace": "default"}}
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        yield a


async def set_phase(api, name: str, phase: str) -> None:
    code, _ = await api.json("PATCH", f"{PODS}/{name}/status", {"status": {"phase": phase}},
                             content_type="application/merge-patch+json")
    assert code == 200


async def test_unscheduled_pod_is_deleted_at_once(api):
    assert (await api.json("POST", PODS, pod()))[0] == 201
    code, body = await api.json("POST", f"{PODS}/p/eviction", ev())
    assert code == 201, body
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    assert (await api.json("GET", f"{PODS}/p"))[0] == 404


@pytest.mark.parametrize("api_version", ["policy/v1", "policy/v1beta1"])
async def test_running_pod_terminates_gracefully_with_disruption_target(api, api_version):
    await api.json("POST", PODS, pod(node="n1", terminationGracePeriodSeconds=45))
    await set_phase(api, "p", "Running")
    code, body = await api.json("POST", f"{PODS}/p/eviction", ev(api_version=api_version))
    assert code == 201, body
    code, got = await api.json("GET", f"{PODS}/p")
    assert code == 200
    assert got["metadata"]["deletionGracePeriodSeconds"] == 45 and got["metadata"]["deletionTimestamp"]
    target = [c for c in got["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert target == [{"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                       "lastTransitionTime": target[0]["lastTransitionTime"],
                       "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}]
    # Evicting a terminating pod again is fine and changes nothing.
    code, _ = await api.json("POST", f"{PODS}/p/eviction", ev())
    assert code == 201
    assert (await api.json("GET", f"{PODS}/p"))[1]["metadata"]["resourceVersion"] == got["metadata"]["resourceVersion"]


async def test_delete_options_grace_period_is_honoured(api):
    await api.json("POST", PODS, pod(node="n1"))
    await set_phase(api, "p", "Running")
    code, _ = await api.json("POST", f"{PODS}/p/eviction", ev(gracePeriodSeconds=0))
    assert code == 201
    assert (await api.json("GET", f"{PODS}/p"))[0] == 404


async def test_dry_run_changes_nothing(api):
    await api.json("POST", PODS, pod(node="n1"))
    await set_phase(api, "p", "Running")
    _, before = await api.json("GET", f"{PODS}/p")
    assert (await api.json("POST", f"{PODS}/p/eviction", ev(), query={"dryRun": "All"}))[0] == 201
    assert (await api.json("POST", f"{PODS}/p/eviction", ev(dryRun=["All"])))[0] == 201
    _, after = await api.json("GET", f"{PODS}/p")
    assert after == before


async def test_uid_precondition(api):
    await api.json("POST", PODS, pod(node="n1"))
    code, body = await api.json("POST", f"{PODS}/p/eviction", ev(preconditions={"uid": "someone-else"}))
    assert code == 409, body


@pytest.mark.parametrize(("path", "body", "code", "fragment"), [
    (f"{PODS}/missing/eviction", ev("missing"), 404, 'pods "missing" not found'),
    (f"{PODS}/p/eviction", ev("other"), 400, "name in URL does not match name in Eviction object"),
    (f"{PODS}/p/eviction", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, 400, "Eviction"),
    (f"{PODS}/p/eviction", ev(gracePeriodSeconds="soon"), 400, "gracePeriodSeconds"),
    (f"{PODS}/p/eviction", ev(propagationPolicy="Never"), 400, "propagationPolicy"),
])
async def test_bad_evictions(api, path, body, code, fragment):
    await api.json("POST", PODS, pod())
    got, status = await api.json("POST", path, body)
    assert got == code, status
    assert status["kind"] == "Status" and fragment in status["message"]


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE"])
async def test_eviction_is_create_only(api, method):
    await api.json("POST", PODS, pod())
    code, _ = await api.json(method, f"{PODS}/p/eviction", ev())
    assert code == 405


def test_discovery_lists_eviction_as_policy_v1_in_both_forms(tmp_path):
    from fleet.api.registry import default_registry

    reg = default_registry()
    legacy = {r["name"]: r for r in api_resource_list(reg, "", "v1")["resources"]}
    assert legacy["pods/eviction"] == {"name": "pods/eviction", "singularName": "", "namespaced": True,
                                       "kind": "Eviction", "group": "policy", "version": "v1",
                                       "verbs": ["create"]}
    assert legacy["nodes/drain"]["kind"] == "NodeDrain" and legacy["nodes/drain"]["verbs"] == ["create", "get"]
    assert legacy["nodes/schedulable"] == {"name": "nodes/schedulable", "singularName": "", "namespaced": False,
                                           "kind": "Node", "verbs": ["create"]}
    core = aggregated(reg, core=True)["items"][0]["versions"][0]["resources"]
    pods = next(r for r in core if r["resource"] == "pods")
    subs = {s["subresource"]: s for s in pods["subresources"]}
    assert subs["eviction"] == {"subresource": "eviction", "verbs": ["create"],
                                "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"}}
    nodes = next(r for r in core if r["resource"] == "nodes")
    assert {s["subresource"] for s in nodes["subresources"]} == {"status", "drain", "schedulable"}


# -- the budget seam ----------------------------------------------------------------------

PDB = KindInfo(group="policy", version="v1", kind="PodDisruptionBudget", plural="poddisruptionbudgets",
               singular="poddisruptionbudget", subresources=("status",))


def pdb(name: str, allowed: int, selector: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default", "generation": 1},
            "spec": {"selector": selector if selector is not None else {"matchLabels": {"app": "a"}}},
            "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "desiredHealthy": 2,
                       "currentHealthy": 2, **status}}


async def test_no_budget_kind_means_no_budgets(api):
    budgets = api.server.resources.budgets
    budgets.registry.unregister("policy", "v1", "poddisruptionbudgets")
    assert await budgets.matching(pod()) == []


@pytest.fixture
async def budgeted(api):
    """The API with a minimal PodDisruptionBudget kind (no defaulting or validation, so the
    tests can store any status) and a Running, Ready pod."""
    api.server.registry.register(PDB)
    await api.json("POST", PODS, pod(node="n1"))
    code, _ = await api.json("PATCH", f"{PODS}/p/status", {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}}, content_type="application/merge-patch+json")
    assert code == 200
    return api


async def put_pdb(api, obj: dict[str, Any]) -> None:
    await api.store.create(meta.store_key("policy", "poddisruptionbudgets", "default", obj["metadata"]["name"]),
                           obj)


async def test_budget_with_no_disruptions_left_is_429(budgeted):
    await put_pdb(budgeted, pdb("web", 0))
    code, body = await budgeted.json("POST", f"{PODS}/p/eviction", ev())
    assert (code, body["reason"]) == (429, "TooManyRequests")
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget",
                                          "message": "The disruption budget web needs 2 healthy pods and has "
                                                     "2 currently"}]
    _, got = await budgeted.json("GET", f"{PODS}/p")
    assert "deletionTimestamp" not in got["metadata"]


async def test_budget_is_decremented_and_records_the_pod(budgeted):
    await put_pdb(budgeted, pdb("web", 1))
    code, _ = await budgeted.json("POST", f"{PODS}/p/eviction", ev())
    assert code == 201
    got = await budgeted.store.get(meta.store_key("policy", "poddisruptionbudgets", "default", "web"))
    assert got["status"]["disruptionsAllowed"] == 0
    assert list(got["status"]["disruptedPods"]) == ["p"]
    assert [c["reason"] for c in got["status"]["conditions"]] == ["InsufficientPods"]


async def test_budget_selecting_other_pods_does_not_apply(budgeted):
    await put_pdb(budgeted, pdb("other", 0, selector={"matchLabels": {"app": "b"}}))
    assert (await budgeted.json("POST", f"{PODS}/p/eviction", ev()))[0] == 201


async def test_two_budgets_is_an_error(budgeted):
    await put_pdb(budgeted, pdb("one", 1))
    await put_pdb(budgeted, pdb("two", 1))
    code, body = await budgeted.json("POST", f"{PODS}/p/eviction", ev())
    assert code == 500 and "more than one PodDisruptionBudget" in body["message"]


async def test_unready_pod_may_go_when_the_budget_is_met(budgeted):
    await budgeted.json("PATCH", f"{PODS}/p/status", {"status": {"conditions": [
        {"type": "Ready", "status": "False"}]}}, content_type="application/merge-patch+json")
    await put_pdb(budgeted, pdb("web", 0, currentHealthy=3, desiredHealthy=2))
    assert (await budgeted.json("POST", f"{PODS}/p/eviction", ev()))[0] == 201


async def test_budget_not_yet_observed_is_429(budgeted):
    await put_pdb(budgeted, pdb("web", 5, observedGeneration=0))  # the store sets generation 1
    code, body = await budgeted.json("POST", f"{PODS}/p/eviction", ev())
    assert code == 429 and "still being processed" in body["details"]["causes"][0]["message"]


async def test_pending_pods_skip_the_budget(budgeted):
    await put_pdb(budgeted, pdb("web", 0))
    await budgeted.json("POST", PODS, pod("q"))
    assert (await budgeted.json("POST", f"{PODS}/q/eviction", ev("q")))[0] == 201


def test_can_ignore_budgets():
    def p(phase: str, deleting: bool = False) -> dict[str, Any]:
        md: dict[str, Any] = {"name": "p"}
        if deleting:
            md["deletionTimestamp"] = "2020-01-01T00:00:00Z"
        return {"metadata": md, "status": {"phase": phase}}

    assert [eviction.can_ignore_budgets(p(ph)) for ph in ("Pending", "Running", "Succeeded", "Failed")] == [
        True, False, True, True]
    assert eviction.can_ignore_budgets(p("Running", deleting=True))


def test_too_many_requests_shape():
    e = eviction.too_many_requests("why", 10)
    assert isinstance(e, errors.TooManyRequests)
    assert e.status()["details"] == {"causes": [{"reason": "DisruptionBudget", "message": "why"}],
                                     "retryAfterSeconds": 10}


async def test_a_budget_write_that_loses_a_race_is_retried_on_the_fresh_budget(budgeted):
    """The disruption controller rewrote the budget between our read and our write: the
    eviction is decided again on the fresh budget, not refused with a 429."""
    await put_pdb(budgeted, pdb("web", 2))
    key = meta.store_key("policy", "poddisruptionbudgets", "default", "web")
    store = budgeted.store
    real_update = store.update
    raced = False

    async def racing_update(k: str, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        nonlocal raced
        if k == key and not raced:
            raced = True
            current = await store.get(key)
            current["status"] = dict(current["status"], disruptionsAllowed=1)
            await real_update(key, current)
        return await real_update(k, obj, **kw)

    store.update = racing_update
    try:
        code, body = await budgeted.json("POST", f"{PODS}/p/eviction", ev())
    finally:
        store.update = real_update
    assert code == 201, body
    got = await store.get(key)
    assert got["status"]["disruptionsAllowed"] == 0 and list(got["status"]["disruptedPods"]) == ["p"]
